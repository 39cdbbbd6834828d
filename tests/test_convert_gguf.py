"""GGUF → .ninfer: tensor mapping, q/k un-permutation, dequantization, rebuilt tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from ninfer import _core  # noqa: E402
from ninfer.artifact import dequantize_q8_0  # noqa: E402
from ninfer.convert import convert_source  # noqa: E402
from ninfer.convert.gguf_tokenizer import GGUFTokenizerError  # noqa: E402
from ninfer.convert.model_config import UnsupportedModelError  # noqa: E402
from ninfer.convert.synthetic_tokenizer import CHATML_TEMPLATE, synthetic_tokenizer_json  # noqa: E402

D, FF, HEADS, KV_HEADS, LAYERS = 64, 96, 4, 2, 2


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's HF→GGUF converter does to q_proj/k_proj rows (reference)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_weights(arch: str, vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    hd = 32 if arch == "qwen3" else D // HEADS
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((vocab, D))}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rng.standard_normal(D)
        w[p + "post_attention_layernorm.weight"] = rng.standard_normal(D)
        w[p + "self_attn.q_proj.weight"] = rng.standard_normal((HEADS * hd, D))
        w[p + "self_attn.k_proj.weight"] = rng.standard_normal((KV_HEADS * hd, D))
        w[p + "self_attn.v_proj.weight"] = rng.standard_normal((KV_HEADS * hd, D))
        w[p + "self_attn.o_proj.weight"] = rng.standard_normal((D, HEADS * hd))
        w[p + "mlp.gate_proj.weight"] = rng.standard_normal((FF, D))
        w[p + "mlp.up_proj.weight"] = rng.standard_normal((FF, D))
        w[p + "mlp.down_proj.weight"] = rng.standard_normal((D, FF))
        if arch == "qwen2":
            w[p + "self_attn.q_proj.bias"] = rng.standard_normal(HEADS * hd)
            w[p + "self_attn.k_proj.bias"] = rng.standard_normal(KV_HEADS * hd)
            w[p + "self_attn.v_proj.bias"] = rng.standard_normal(KV_HEADS * hd)
        if arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = rng.standard_normal(hd)
            w[p + "self_attn.k_norm.weight"] = rng.standard_normal(hd)
    w["model.norm.weight"] = rng.standard_normal(D)
    w["lm_head.weight"] = rng.standard_normal((vocab, D))
    return {k: v.astype(np.float32) for k, v in w.items()}


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
# Storage type per tensor kind in the synthetic GGUF: one of each interesting case.
STORAGE = {
    "attn_q.weight": Q.Q8_0,
    "attn_k.weight": Q.Q4_0,
    "attn_v.weight": Q.F16,
    "ffn_gate.weight": Q.Q4_1,
    "token_embd.weight": Q.Q8_0,
    "output.weight": Q.BF16,
}


def write_gguf(path: Path, arch: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Write a GGUF like llama.cpp's converter would; returns the HF-layout values it holds."""
    tokenizer = json.loads(synthetic_tokenizer_json())
    vocab = {
        **tokenizer["model"]["vocab"],
        **{t["content"]: t["id"] for t in tokenizer["added_tokens"]},
    }
    tokens = sorted(vocab, key=vocab.__getitem__)
    types = [
        3 if t.startswith("<|") else 4 if t.startswith("<") and len(t) > 1 else 1 for t in tokens
    ]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(5e5)
    writer.add_layer_norm_rms_eps(1e-5)
    if arch == "qwen3":
        writer.add_key_length(32)
        writer.add_value_length(32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_chat_template(CHATML_TEMPLATE)
    held: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            gguf_name = f"blk.{index}.{GGUF_NAMES[rest]}"
        else:
            gguf_name = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        stored = value
        if arch == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            stored = llama_cpp_permute(value, HEADS if "attn_q" in gguf_name else KV_HEADS)
        qtype = STORAGE.get(gguf_name.split(".", 2)[-1] if "blk" in gguf_name else gguf_name, Q.F32)
        if qtype == Q.F32:
            writer.add_tensor(gguf_name, stored)
            held_value = stored
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name, stored.astype(np.float16))
            held_value = stored.astype(np.float16).astype(np.float32)
        elif qtype == Q.BF16:
            bits = torch.from_numpy(stored).to(torch.bfloat16).view(torch.int16).numpy()
            writer.add_tensor(
                gguf_name, bits.view(np.uint8).reshape(stored.shape[0], -1), raw_dtype=Q.BF16
            )
            held_value = torch.from_numpy(stored).to(torch.bfloat16).float().numpy()
        else:
            blocks = quantize(stored, qtype)
            writer.add_tensor(gguf_name, blocks, raw_dtype=qtype)
            held_value = dequantize(blocks, qtype).reshape(stored.shape)
        if arch == "llama" and gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            # undo the permutation on the held values to state them in HF layout
            n = HEADS if "attn_q" in gguf_name else KV_HEADS
            held_value = (
                held_value.reshape(n, held_value.shape[0] // n // 2, 2, -1)
                .swapaxes(1, 2)
                .reshape(held_value.shape)
            )
        held[name] = held_value
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def as_f32(art: _core.Artifact, name: str) -> np.ndarray:
    info = art.tensor_info(name)
    if info["dtype"] == "q8_0":
        return dequantize_q8_0(art.tensor(name), info["shape"])
    assert info["dtype"] == "f32", name
    return np.asarray(art.tensor(name))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_round_trip(tmp_path: Path, arch: str) -> None:
    weights = hf_weights(arch, 400, np.random.default_rng(11))
    held = write_gguf(tmp_path / "tiny.gguf", arch, weights)
    out = convert_source(
        tmp_path / "tiny.gguf", tmp_path / "f32.ninfer", dtype="f32", progress=False
    )
    art = _core.Artifact.open(str(out))
    assert art.architecture == arch
    assert sorted(art.tensor_names()) == sorted(weights)
    for name in weights:
        np.testing.assert_array_equal(as_f32(art, name), held[name], err_msg=name)
        step = np.abs(weights[name]).max() / 7  # coarsest storage here is 4-bit
        np.testing.assert_allclose(held[name], weights[name], atol=step, err_msg=name)
        if name.endswith(
            ("norm.weight", "o_proj.weight", "up_proj.weight", "down_proj.weight", ".bias")
        ):
            np.testing.assert_array_equal(as_f32(art, name), weights[name], err_msg=name)
    header = json.loads(art.header_json)
    config = header["config"]
    assert config["rope_theta"] == 5e5 and config["rms_norm_eps"] == 1e-5
    assert config["head_dim"] == (32 if arch == "qwen3" else 16)
    assert config["qk_norm"] == (arch == "qwen3") and config["tie_word_embeddings"] is False
    assert config["attention_bias"] == (arch == "qwen2")
    assert art.resource("chat_template.jinja").decode() == CHATML_TEMPLATE

    keep = _core.Artifact.open(
        str(convert_source(tmp_path / "tiny.gguf", tmp_path / "k.ninfer", progress=False))
    )
    dtypes = {n: keep.tensor_info(n)["dtype"] for n in keep.tensor_names()}
    assert dtypes["model.layers.0.self_attn.v_proj.weight"] == "f16"  # float sources stay
    assert dtypes["lm_head.weight"] == "bf16"
    assert dtypes["model.layers.1.mlp.down_proj.weight"] == "f32"
    assert dtypes["model.layers.0.self_attn.k_proj.weight"] == "q8_0"  # Q4_0 re-quantized
    assert dtypes["model.layers.0.input_layernorm.weight"] == "f32"
    # Q8_0 sources are copied block for block (after the row un-permutation)
    q8 = (
        dequantize_q8_0(keep.tensor("model.layers.0.self_attn.q_proj.weight"), (HEADS * 16, D))
        if arch == "llama"
        else None
    )
    if q8 is not None:
        np.testing.assert_array_equal(q8, held["model.layers.0.self_attn.q_proj.weight"])
    k = as_f32(keep, "model.layers.0.self_attn.k_proj.weight")
    step = np.abs(held["model.layers.0.self_attn.k_proj.weight"]).reshape(-1, 32).max(1) / 127
    err = np.abs(k - held["model.layers.0.self_attn.k_proj.weight"]).reshape(-1, 32).max(1)
    assert np.all(err <= step * 0.57)


def test_tiny_llama_gguf_matches_transformers_loader(tmp_path: Path) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    weights = hf_weights("llama", 400, np.random.default_rng(12))
    write_gguf(tmp_path / "tiny.gguf", "llama", weights)
    out = convert_source(
        tmp_path / "tiny.gguf", tmp_path / "f32.ninfer", dtype="f32", progress=False
    )
    art = _core.Artifact.open(str(out))
    config = load_gguf_checkpoint(str(tmp_path / "tiny.gguf"))["config"]
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    theirs = load_gguf_checkpoint(
        str(tmp_path / "tiny.gguf"), return_tensors=True, model_to_load=model
    )["tensors"]
    for name in art.tensor_names():
        np.testing.assert_array_equal(as_f32(art, name), np.asarray(theirs[name]), err_msg=name)


def test_unknown_pre_tokenizer_is_refused(tmp_path: Path) -> None:
    from ninfer.convert.gguf_tokenizer import build_tokenizer_json

    with pytest.raises(GGUFTokenizerError, match="unsupported tokenizer.ggml.pre 'mystery'"):
        build_tokenizer_json(
            model="gpt2",
            pre="mystery",
            tokens=["a"],
            token_types=[1],
            merges=[],
            bos_token_id=None,
            add_bos_token=False,
        )
    with pytest.raises(GGUFTokenizerError, match="only gpt2-style"):
        build_tokenizer_json(
            model="llama",
            pre=None,
            tokens=["a"],
            token_types=[1],
            merges=[],
            bos_token_id=None,
            add_bos_token=False,
        )


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "x.gguf", "falcon")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'falcon' unsupported"):
        convert_source(tmp_path / "x.gguf", tmp_path / "x.ninfer", progress=False)


def regex_sequence_split(text: str, patterns: tuple[str, ...]) -> list[str]:
    """llama.cpp's unicode_regex_split semantics with Python's `regex` engine: each pattern
    splits every piece further, matches and the gaps between them both become pieces."""
    regex = pytest.importorskip("regex")
    words = [text]
    for pattern in patterns:
        compiled = regex.compile(pattern)
        pieces: list[str] = []
        for word in words:
            cursor = 0
            for match in compiled.finditer(word):
                pieces += [word[cursor:match.start()]] if match.start() > cursor else []
                pieces += [match.group()] if match.end() > match.start() else []
                cursor = match.end()
            pieces += [word[cursor:]] if cursor < len(word) else []
        words = pieces
    return words


@pytest.mark.parametrize("pre", ["default", "gpt2", "smollm", "llama-bpe", "qwen2"])
def test_pre_tokenizers_split_like_the_regex_lists(pre: str) -> None:
    import random

    from tokenizers import Tokenizer

    from ninfer.convert.gguf_tokenizer import (
        PRE_TOKENIZER_REGEXES,
        build_tokenizer_json,
        resolve_pre_tokenizer,
    )
    from ninfer.tokenizer import unicode_to_bytes

    document = json.loads(synthetic_tokenizer_json())
    tokens = sorted(document["model"]["vocab"], key=document["model"]["vocab"].__getitem__)
    built = build_tokenizer_json(model="gpt2", pre=pre, tokens=tokens, token_types=[1] * len(
        tokens), merges=[" ".join(m) for m in document["model"]["merges"]], bos_token_id=0,
        add_bos_token=True)
    tokenizer = Tokenizer.from_str(built.decode())
    assert json.loads(built)["model"]["ignore_merges"] == (pre == "llama-bpe")
    assert tokenizer.encode("hi").ids[0] == 0  # add_bos_token: BOS through the post-processor
    alphabet = unicode_to_bytes()
    rng = random.Random(7)
    pool = list("ab XY\n\t\r0123456789.,'!$+<=>^~|-") + ["é", "中", "🙂", "'S", "'ll", "  "]
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(300)]
    patterns = PRE_TOKENIZER_REGEXES[resolve_pre_tokenizer(pre)]
    for text in texts + ["12345678 and 1,234", "I'M HERE'S", "  \n\n  x"]:
        pieces = [bytes(alphabet[c] for c in piece).decode()
                  for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
        assert pieces == regex_sequence_split(text, patterns), repr(text)
