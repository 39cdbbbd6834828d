"""Grammar masks on the CUDA backend (GPU machine only): the core uploads each step's packed
mask and the device sampling kernel applies it, so a constrained greedy decode of a random
model on CUDA must be valid by construction, as the CPU backend's decode (whose mask is
applied on the host) is. The two need not agree token for token: CUDA's matmuls round
differently and a random model's allowed logits are close, so a near tie can flip (seen on
the H200, 2026-12-01). The exact device-mask-equals-host-mask check runs on one backend's
logits in test_cuda_sampling.py::test_engine_constrained_decode_device_matches_host.
Engine-level and plain json, so the GPU machine needs neither the OpenAI SDK nor jsonschema.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from ninfer.engine_types import EngineConfig, GenerationRequest, SamplingParams

_core = pytest.importorskip("ninfer._core")
from ninfer.convert.random import make_random_artifact  # noqa: E402
from ninfer.engine import AsyncEngine  # noqa: E402

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
    yield opened
    for engine in opened.values():
        asyncio.run(engine.close())


async def _decode(engine: AsyncEngine, kind: str, source: str) -> tuple[list[int], str, dict]:
    prompt = engine.tokenizer.encode("Describe a pet as JSON:")
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
def test_cuda_constrained_greedy_decode_is_valid_like_cpu(engines, name):
    kind, source = CONSTRAINTS[name]
    results = {device: asyncio.run(_decode(engine, kind, source))
               for device, engine in engines.items()}  # fmt: skip
    cpu_tokens, cpu_text, _ = results["cpu"]
    cuda_tokens, cuda_text, cuda_stats = results["cuda:0"]
    assert _valid(name, cuda_text), cuda_text
    assert _valid(name, cpu_text), cpu_text
    assert cpu_tokens  # both decoded something in the language
    assert cuda_stats["terminated"] and cuda_stats["mask_positions"] == len(cuda_tokens)
    assert cuda_stats["mask_upload_bytes"] == len(cuda_tokens) * 4 * ((448 + 31) // 32)
