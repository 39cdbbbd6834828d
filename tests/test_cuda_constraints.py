"""Grammar masks on the CUDA backend (GPU machine only): the core uploads each step's packed
mask and the device sampling kernel applies it, so a constrained greedy decode of a random
model on CUDA must be valid by construction and equal, token for token, the CPU backend's
decode (whose mask is applied on the host). CUDA's matmuls round differently from the CPU's
float32, so where a random model's two best allowed logits are a near tie the choice can flip
(seen once on the H200, 2026-12-01): the decodes must agree up to their first difference, and
there the CPU's own logits must show a tie (the two tokens within rounding of each other);
an undisputed difference fails. The exact device-mask-equals-host-mask check on one backend's
logits is test_cuda_sampling.py::test_engine_constrained_decode_device_matches_host.
Engine-level and plain json, so the GPU machine needs neither the OpenAI SDK nor jsonschema.
"""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from ninfer.engine_types import EngineConfig, GenerationRequest, SamplingParams

_core = pytest.importorskip("ninfer._core")
from ninfer.artifact import read_header  # noqa: E402
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402
from ninfer.tokenizer import Tokenizer  # noqa: E402
from toy_engine import run_one  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

# The hybrid shape the CUDA kernels take (see test_server_hybrid_engine.py), with model rows
# past the synthetic tokenizer's ids: those padding rows must stay masked on the device too.
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=448, mtp_num_hidden_layers=0,
)  # fmt: skip
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "json_schema": ("strict_json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
    "regex": ("regex", "(BUG|TASK)-[0-9]{4}"),
    "choice": ("ebnf", 'root ::= "positive" | "neutral" | "negative"'),
}


def _valid(name: str, text: str) -> bool:
    if name == "regex":
        return re.fullmatch(r"(BUG|TASK)-[0-9]{4}", text) is not None
    if name == "choice":
        return text in ("positive", "neutral", "negative")
    value = json.loads(text)
    return (
        list(value) == ["name", "age", "kind"]
        and isinstance(value["name"], str)
        and len(value["name"]) <= 8
        and type(value["age"]) is int
        and 0 <= value["age"] <= 99
        and value["kind"] in ("cat", "dog")
    )


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    where = tmp_path_factory.mktemp("art") / "hybrid.ninfer"
    path = make_random_artifact(CONFIG, where, seed=11, tokenizer="synthetic", dtype="f32")
    opened = {}
    for device in ("cpu", "cuda:0"):
        config = EngineConfig(device=device, max_concurrency=2, max_context=512, prefill_chunk=64,
                              max_pending_requests=4, threads=1, kv_capacity=2 * 512)  # fmt: skip
        opened[device] = AsyncEngine.open(path, config)
    yield opened, path
    for engine in opened.values():
        asyncio.run(engine.close())


def _cpu_logits_after(path, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The CPU model's float32 logits for the token after prompt + tokens (unconstrained)."""
    table = Tokenizer(read_header(path).resource("tokenizer.json")).token_bytes()
    options = _core.EngineOptions(max_concurrency=1, max_context=512, prefill_chunk=64)
    engine = _core.Engine.open(str(path), options, table, threads=1)
    try:
        outcome = run_one(engine, prompt + tokens, 1, temperature=0.0, capture_logits=True)
        return np.asarray([e.logits for e in outcome.events if e.token_ids][0])
    finally:
        engine.shutdown()


def _prompt(engine: AsyncEngine) -> list[int]:
    return engine.tokenizer.encode("Describe a pet as JSON:")


async def _decode(engine: AsyncEngine, kind: str, source: str) -> tuple[list[int], str, dict]:
    prompt = _prompt(engine)
    request = GenerationRequest(
        prompt_ids=prompt,
        max_tokens=96,
        sampling=SamplingParams(temperature=0.0),
        constraint=engine.compile_constraint(kind, source),
    )
    tokens: list[int] = []
    text = b""
    async for event in engine.submit(request):
        tokens += event.token_ids
        text += event.text
        if event.finished:
            assert event.finish_reason == "stop", (event.finish_reason, event.error)
            return tokens, text.decode(), event.constraint
    raise AssertionError("no final event")


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_cuda_constrained_greedy_decode_matches_cpu(engines, name):
    engines, path = engines
    kind, source = CONSTRAINTS[name]
    results = {device: asyncio.run(_decode(engine, kind, source))
               for device, engine in engines.items()}  # fmt: skip
    cpu_tokens, cpu_text, _ = results["cpu"]
    cuda_tokens, cuda_text, cuda_stats = results["cuda:0"]
    assert _valid(name, cuda_text), cuda_text
    assert _valid(name, cpu_text), cpu_text
    pairs = zip(cuda_tokens, cpu_tokens, strict=False)
    differ = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if differ is None:
        assert cuda_tokens == cpu_tokens, (cuda_text, cpu_text)
    else:  # a flip is allowed only at a near tie of the CPU's own logits
        logits = _cpu_logits_after(path, _prompt(engines["cpu"]), cpu_tokens[:differ])
        gap = float(logits[cpu_tokens[differ]] - logits[cuda_tokens[differ]])
        spread = float(logits.max() - logits.min())
        assert 0 <= gap <= 1e-2 * spread, (differ, gap, spread, cuda_text, cpu_text)
    assert cuda_stats["terminated"] and cuda_stats["mask_positions"] == len(cuda_tokens)
    assert cuda_stats["mask_upload_bytes"] == len(cuda_tokens) * 4 * ((448 + 31) // 32)
