"""Random-weight artifacts: loadable by HF with finite outputs, reproducible, streamed."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, dequantize_q8_0
from ninfer.convert.random import make_random_artifact
from ninfer.convert.synthetic_tokenizer import synthetic_token_ids

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
         "head_dim": 32, "vocab_size": 448, "rope_theta": 1e6}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 400}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state_dict(art: _core.Artifact) -> dict[str, np.ndarray]:
    out = {}
    for name in art.tensor_names():
        info = art.tensor_info(name)
        raw = art.tensor(name)
        if info["dtype"] == "bf16":
            out[name] = bf16_bits_to_f32(raw)
        elif info["dtype"] == "q8_0":
            out[name] = dequantize_q8_0(raw, info["shape"])
        else:
            out[name] = np.array(raw, dtype=np.float32)
    return out


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = make_random_artifact(LLAMA, tmp_path / "a.ninfer", seed=5)
    b = make_random_artifact(LLAMA, tmp_path / "b.ninfer", seed=5)
    c = make_random_artifact(LLAMA, tmp_path / "c.ninfer", seed=6)
    assert digest(a) == digest(b) != digest(c)


@pytest.mark.parametrize(("config", "dtype"), [(LLAMA, "bf16"), (QWEN3, "q8_0"), (QWEN2, "f32")])
def test_random_artifact_runs_in_transformers(tmp_path: Path, config: dict, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = make_random_artifact(config, tmp_path / "r.ninfer", seed=1, dtype=dtype)
    art = _core.Artifact.open(str(path))
    header = json.loads(art.header_json)
    assert header["metadata"]["created"] is None
    weights = state_dict(art)
    for name, values in weights.items():
        assert art.tensor_info(name)["dtype"] == ("f32" if values.ndim == 1 else dtype)
        if values.ndim == 2:
            assert 0.015 < values.std() < 0.025, name
    stored_config = json.loads(art.resource("config.json"))
    hf_config = transformers.AutoConfig.for_model(**stored_config)
    model = transformers.AutoModelForCausalLM.from_config(hf_config)
    tied = {"lm_head.weight"} if config.get("tie_word_embeddings") else set()
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v.copy()) for k, v in weights.items()}, strict=False)
    assert set(missing) <= tied and not unexpected
    ids = list(synthetic_token_ids().values())
    logits = model(torch.tensor([ids])).logits
    assert torch.isfinite(logits).all()
    assert art.resource("chat_template.jinja").startswith(b"{%- for message in messages")
    tokenizer = header["tokenizer"]
    assert tokenizer["eos_token"] == "<|im_end|>"
    assert tokenizer["eos_token_ids"][0] == synthetic_token_ids()["<|im_end|>"]


def test_tokenizer_must_fit_vocab(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        make_random_artifact(dict(LLAMA, vocab_size=100), tmp_path / "x.ninfer")


def test_generation_is_streamed(tmp_path: Path) -> None:
    # A 32768 x 1024 embedding is 128 MB as float32; the writer must never hold it whole.
    config = dict(LLAMA, hidden_size=1024, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=8, num_key_value_heads=8, vocab_size=32768)
    tracemalloc.start()
    try:
        make_random_artifact(config, tmp_path / "big.ninfer")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"peak {peak / 2**20:.0f} MiB"
