"""HF safetensors folder → .ninfer: every tensor must come out equal to the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf_quants = pytest.importorskip("gguf.quants")

from gguf import GGMLQuantizationType  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from ninfer import _core  # noqa: E402
from ninfer.artifact import bf16_bits_to_f32, dequantize_q8_0, quantize_q8_0  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.model_config import UnsupportedModelError  # noqa: E402
from ninfer.convert.synthetic_tokenizer import (  # noqa: E402
    CHATML_TEMPLATE,
    synthetic_token_ids,
    synthetic_tokenizer_json,
)

SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=420,
    max_position_embeddings=512,
)


def make_model(
    kind: str,
    folder: Path,
    *,
    dtype: torch.dtype,
    tie: bool = False,
    shard: bool = False,
    **extra: object,
) -> dict[str, torch.Tensor]:
    torch.manual_seed(hash(kind) % 1000)
    ids = synthetic_token_ids()
    common = dict(
        SMALL,
        tie_word_embeddings=tie,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        **extra,
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=32, **common))
    with torch.no_grad():  # HF zero-initialises biases and ones the norms; make them distinct
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p))
    model = model.to(dtype)
    model.save_pretrained(folder, max_shard_size="40KB" if shard else "10GB")
    (folder / "tokenizer.json").write_bytes(synthetic_tokenizer_json())
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHATML_TEMPLATE,
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "pad_token": "<|endoftext|>",
            }
        )
    )
    (folder / "generation_config.json").write_text(
        json.dumps(
            {
                "temperature": 0.7,
                "top_p": 0.8,
                "top_k": 20,
                "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            }
        )
    )
    tensors: dict[str, torch.Tensor] = {}
    for path in folder.glob("*.safetensors"):
        tensors.update(load_file(path))
    return tensors


def as_float(art: _core.Artifact, name: str) -> np.ndarray:
    info = art.tensor_info(name)
    raw = art.tensor(name)
    if info["dtype"] == "bf16":
        return bf16_bits_to_f32(raw)
    if info["dtype"] == "q8_0":
        return dequantize_q8_0(raw, info["shape"])
    return raw.astype(np.float32)


@pytest.mark.parametrize(
    ("kind", "dtype", "tie", "shard"),
    [
        ("llama", torch.float32, False, False),
        ("llama", torch.bfloat16, True, True),
        ("qwen2", torch.bfloat16, False, True),
        ("qwen3", torch.bfloat16, True, False),
        ("qwen3", torch.float32, False, True),
    ],
)
def test_keep_reproduces_every_tensor(
    tmp_path: Path, kind: str, dtype: torch.dtype, tie: bool, shard: bool
) -> None:
    source = make_model(kind, tmp_path / "hf", dtype=dtype, tie=tie, shard=shard)
    assert shard == (tmp_path / "hf" / "model.safetensors.index.json").exists()
    out = convert_source(tmp_path / "hf", tmp_path / "m.ninfer", progress=False, name="tiny")
    art = _core.Artifact.open(str(out))
    header = json.loads(art.header_json)
    assert art.architecture == kind and header["metadata"]["name"] == "tiny"
    expected = set(source) - ({"lm_head.weight"} if tie else set())
    assert set(art.tensor_names()) == expected
    for name in expected:
        want = source[name]
        info = art.tensor_info(name)
        assert info["shape"] == list(want.shape), name
        if want.ndim == 1:  # norms and biases are always stored as f32
            assert info["dtype"] == "f32"
            np.testing.assert_array_equal(art.tensor(name), want.float().numpy(), err_msg=name)
        elif dtype == torch.bfloat16:
            assert info["dtype"] == "bf16"
            np.testing.assert_array_equal(
                art.tensor(name), want.view(torch.int16).numpy().view(np.uint16)
            )
        else:
            assert info["dtype"] == "f32"
            np.testing.assert_array_equal(art.tensor(name), want.numpy())
    config = header["config"]
    assert config["tie_word_embeddings"] == tie
    assert config["attention_bias"] == (kind == "qwen2")
    assert config["qk_norm"] == (kind == "qwen3")
    assert config["head_dim"] == (32 if kind == "qwen3" else 16)
    assert config["rope_scaling"] is None and config["rope_theta"] == 10000.0
    ids = synthetic_token_ids()
    assert header["tokenizer"] == {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_ids": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "add_bos_token": False,
    }
    assert header["generation"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    hf = tmp_path / "hf"
    assert art.resource("tokenizer.json") == (hf / "tokenizer.json").read_bytes()
    assert art.resource("config.json") == (hf / "config.json").read_bytes()
    assert art.resource("generation_config.json") == (hf / "generation_config.json").read_bytes()
    assert art.resource("chat_template.jinja").decode() == CHATML_TEMPLATE


def test_q8_0_and_bf16_targets(tmp_path: Path) -> None:
    source = make_model("qwen3", tmp_path / "hf", dtype=torch.float32)
    q8 = _core.Artifact.open(
        str(convert_source(tmp_path / "hf", tmp_path / "q.ninfer", dtype="q8_0", progress=False))
    )
    bf = _core.Artifact.open(
        str(convert_source(tmp_path / "hf", tmp_path / "b.ninfer", dtype="bf16", progress=False))
    )
    for name, want in source.items():
        want = want.numpy()
        if want.ndim == 1:
            assert q8.tensor_info(name)["dtype"] == bf.tensor_info(name)["dtype"] == "f32"
            continue
        assert q8.tensor_info(name)["dtype"] == "q8_0"
        reference = gguf_quants.quantize(want, GGMLQuantizationType.Q8_0)
        mismatched = np.mean(q8.tensor(name) != reference.reshape(q8.tensor(name).shape))
        assert mismatched < 1e-3, name  # rounding ties may differ; values must not
        blocks = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
        err = np.abs(as_float(q8, name).reshape(-1, 32) - want.reshape(-1, 32))
        # half a quantization step, plus the fp16 rounding of the scale times |q| <= 127
        assert np.all(err <= blocks * (0.5 + 127 * 2.0**-11) * 1.001), name
        expected_bf16 = torch.from_numpy(want).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(as_float(bf, name), expected_bf16)


def test_q8_0_quantizer_matches_gguf() -> None:
    x = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    reference = gguf_quants.quantize(x, GGMLQuantizationType.Q8_0)
    ours = quantize_q8_0(x)
    assert np.mean(ours != reference) < 1e-3
    np.testing.assert_allclose(
        dequantize_q8_0(ours, x.shape),
        gguf_quants.dequantize(reference, GGMLQuantizationType.Q8_0),
        atol=float(np.abs(x).max()) / 127,
    )


def test_rope_scaling_is_normalized(tmp_path: Path) -> None:
    make_model(
        "llama",
        tmp_path / "hf",
        dtype=torch.float32,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rope_theta=5e5,
    )
    out = convert_source(tmp_path / "hf", tmp_path / "m.ninfer", progress=False)
    config = json.loads(_core.Artifact.open(str(out)).header_json)["config"]
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert config["rope_theta"] == 5e5


def test_bad_sources_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "hf"
    make_model("llama", source, dtype=torch.float32)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(
        json.dumps(dict(config, architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    )
    with pytest.raises(UnsupportedModelError, match="unsupported architecture"):
        convert_source(source, tmp_path / "m.ninfer", progress=False)
    (source / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=3)))
    with pytest.raises(UnsupportedModelError, match="lacks tensors"):
        convert_source(source, tmp_path / "m.ninfer", progress=False)
    (source / "config.json").write_text(json.dumps(dict(config, intermediate_size=128)))
    with pytest.raises(UnsupportedModelError, match="has shape"):
        convert_source(source, tmp_path / "m.ninfer", progress=False)
    assert not (tmp_path / "m.ninfer").exists()
    with pytest.raises(ValueError, match="not a model folder"):
        convert_source(source / "config.json", tmp_path / "m.ninfer", progress=False)
