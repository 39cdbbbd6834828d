"""GGUF file → .ninfer (llama, qwen2, qwen3 architectures).

Weights are renamed to Hugging Face names, llama.cpp's q/k row permutation is undone for
llama-arch files (our RoPE uses HF's rotate-half layout), quantized tensors are dequantized
and, by default, re-encoded as q8_0 (Q8_0 source blocks are copied as they are). The
tokenizer is rebuilt from the tokenizer.ggml.* metadata (see gguf_tokenizer.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from ninfer.artifact import ArtifactWriter
from ninfer.artifact.layout import Q8_0_BLOCK
from ninfer.convert.gguf_tokenizer import (
    END_OF_GENERATION_SPELLINGS,
    TOKEN_CONTROL,
    build_tokenizer_json,
    resolve_pre_tokenizer,
)
from ninfer.convert.header_fields import metadata
from ninfer.convert.model_config import (
    UnsupportedModelError,
    expected_tensors,
    normalize_config,
)
from ninfer.convert.progress import progress_bar
from ninfer.convert.tensors import TARGET_DTYPES, encode, row_ranges

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(.+)")
_FLOAT_SOURCES = {
    GGMLQuantizationType.F32: "f32",
    GGMLQuantizationType.F16: "f16",
    GGMLQuantizationType.BF16: "bf16",
}
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
}


class GGUFConversionError(ValueError):
    pass


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_PATTERN.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    if gguf_name == "rope_freqs.weight":
        raise UnsupportedModelError(
            "GGUF carries rope_freqs (llama3-style RoPE frequency factors), not supported yet"
        )
    raise UnsupportedModelError(f"unknown GGUF tensor {gguf_name!r}")


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order turning llama.cpp's interleaved q/k layout back into HF's half-split one.

    llama.cpp's converter stores each head's rows (i, i + d/2) of the HF weight as adjacent
    pairs (2i, 2i + 1); HF row (head h, half t, index j) is GGUF row (h, j, t).
    """
    head_dim = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


class _Metadata:
    def __init__(self, reader: GGUFReader) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def strings(self, key: str) -> list[str]:
        # contents() decodes strings one by one; indexing the parts is much faster for 150k.
        field = self._fields.get(key)
        if field is None:
            return []
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _hf_config(meta: _Metadata, arch: str, vocab_size: int, tied: bool) -> dict[str, Any]:
    def key(suffix: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{suffix}", default)

    hidden = key("embedding_length")
    heads = key("attention.head_count")
    if hidden is None or heads is None or key("block_count") is None:
        raise GGUFConversionError(f"GGUF lacks {arch}.embedding_length/head_count/block_count")
    head_dim = key("attention.key_length") or hidden // heads
    rope_dims = key("rope.dimension_count")
    if rope_dims is not None and rope_dims != head_dim:
        raise UnsupportedModelError(f"partial rotary ({rope_dims} of {head_dim} dims) unsupported")
    scaling_type = key("rope.scaling.type")
    rope_scaling = None
    if scaling_type not in (None, "none"):
        rope_scaling = {
            "rope_type": scaling_type,
            "factor": _float32(key("rope.scaling.factor", 1)),
        }
        original = key("rope.scaling.original_context_length")
        if original is not None:
            rope_scaling["original_max_position_embeddings"] = int(original)
    return {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": int(hidden),
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "vocab_size": vocab_size,
        "rms_norm_eps": _float32(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _float32(key("rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(key("context_length", 4096)),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }


def _tokenizer_header(meta: _Metadata, tokens: list[str], types: list[int]) -> dict[str, Any]:
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_ids: list[int] = []
    for k in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = meta.get(f"tokenizer.ggml.{k}")
        if value is not None and int(value) not in eos_ids:
            eos_ids.append(int(value))
    for token_id, token in enumerate(tokens):
        if token in END_OF_GENERATION_SPELLINGS and types[token_id] == TOKEN_CONTROL:
            if token_id not in eos_ids:
                eos_ids.append(token_id)
    pad_id = meta.get("tokenizer.ggml.padding_token_id")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:  # llama.cpp's default: only llama3-style vocabularies add BOS
        add_bos = resolve_pre_tokenizer(meta.get("tokenizer.ggml.pre")) == "llama3"
    return {
        "bos_token": None if bos_id is None else tokens[bos_id],
        "eos_token": tokens[eos_ids[0]] if eos_ids else None,
        "bos_token_id": None if bos_id is None else int(bos_id),
        "eos_token_ids": eos_ids,
        "pad_token_id": None if pad_id is None else int(pad_id),
        "add_bos_token": bool(add_bos),
    }


def _tokenizer(meta: _Metadata, tokens: list[str], types: list[int]) -> tuple[bytes, dict]:
    header = _tokenizer_header(meta, tokens, types)
    tokenizer_json = build_tokenizer_json(
        model=meta.get("tokenizer.ggml.model"),
        pre=meta.get("tokenizer.ggml.pre"),
        tokens=tokens,
        token_types=types,
        merges=meta.strings("tokenizer.ggml.merges"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        add_bos_token=header["add_bos_token"],
    )
    return tokenizer_json, header


def _tokens(meta: _Metadata, path: Path) -> tuple[list[str], list[int]]:
    tokens = meta.strings("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFConversionError(f"{path}: GGUF has no tokenizer.ggml.tokens")
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [])] or [1] * len(tokens)
    return tokens, types


def read_gguf_tokenizer(path: str | Path) -> tuple[bytes, dict[str, Any]]:
    """(tokenizer.json content, header tokenizer section) of a GGUF file, weights untouched."""
    path = Path(path)
    meta = _Metadata(_open(path))
    return _tokenizer(meta, *_tokens(meta, path))


def _open(path: Path) -> GGUFReader:
    try:
        return GGUFReader(path)
    except (ValueError, OSError) as e:
        raise GGUFConversionError(f"{path}: cannot read GGUF: {e}") from e


def _float32(value: Any) -> float:
    """GGUF stores float32: keep its shortest round-trip decimal (1e-05, not 9.9999997e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def _target_dtype(qtype: GGMLQuantizationType, shape: tuple[int, ...], requested: str) -> str:
    if requested not in TARGET_DTYPES:
        raise ValueError(f"unknown --dtype {requested!r}; choose one of {', '.join(TARGET_DTYPES)}")
    if requested in ("fp8", "nvfp4"):
        raise ValueError(f"--dtype {requested} converts safetensors checkpoints and random "
                         "artifacts; a GGUF source takes keep, f32, bf16 or q8_0")
    if len(shape) < 2:
        return "f32"
    if requested in ("f32", "bf16"):
        return requested
    if requested == "keep" and qtype in _FLOAT_SOURCES:
        return _FLOAT_SOURCES[qtype]
    # keep (quantized source) or q8_0: q8_0 wherever the row length allows it
    return "q8_0" if shape[-1] % Q8_0_BLOCK == 0 else "bf16"


def _source_rows(tensor: Any) -> tuple[np.ndarray, str]:
    """(rows of the stored data, encoding): float arrays as numbers, others as raw block bytes."""
    qtype = tensor.tensor_type
    data = tensor.data
    if qtype == GGMLQuantizationType.BF16:
        return data.view(np.uint16).reshape(data.shape[0], -1), "bf16"
    if qtype in _FLOAT_SOURCES:
        return data, _FLOAT_SOURCES[qtype]
    return data, qtype.name


def _encode_rows(
    rows: np.ndarray, source: str, qtype: GGMLQuantizationType, target: str
) -> np.ndarray:
    if source == target.upper() == "Q8_0":
        return np.ascontiguousarray(rows)  # same block layout: copy the blocks untouched
    if source in ("f32", "f16", "bf16"):
        return encode(rows, source, target)
    return encode(dequantize(rows, qtype), "f32", target)


def convert_gguf(
    path: str | Path,
    output: str | Path,
    *,
    dtype: str = "keep",
    progress: bool = True,
    name: str | None = None,
    generation: dict[str, float | int] | None = None,
) -> Path:
    path = Path(path)
    reader = _open(path)
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} unsupported "
            f"(supported: {', '.join(_ARCHITECTURES)})"
        )
    tokens, types = _tokens(meta, path)
    sources = {hf_tensor_name(t.name): t for t in reader.tensors}
    if "model.embed_tokens.weight" not in sources:
        raise GGUFConversionError(f"{path}: GGUF has no token_embd.weight")
    vocab_size = int(sources["model.embed_tokens.weight"].shape[-1])
    hf_config = _hf_config(meta, arch, vocab_size, tied="lm_head.weight" not in sources)
    config = normalize_config(arch, hf_config)
    shapes = expected_tensors(config)
    missing = [n for n in shapes if n not in sources]
    extra = [n for n in sources if n not in shapes]
    if missing or extra:
        raise UnsupportedModelError(
            f"{path}: tensors missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for tensor_name, shape in shapes.items():
        gguf_shape = tuple(int(d) for d in reversed(sources[tensor_name].shape))
        if gguf_shape != shape:
            raise UnsupportedModelError(
                f"{path}: {sources[tensor_name].name} has shape {list(gguf_shape)}, "
                f"the metadata implies {list(shape)}"
            )

    tokenizer_json, tokenizer = _tokenizer(meta, tokens, types)
    hf_config.update(
        bos_token_id=tokenizer["bos_token_id"], eos_token_id=tokenizer["eos_token_ids"] or None
    )
    generation = {
        ours: meta.get(key) for key, ours in _SAMPLING_KEYS.items() if meta.get(key) is not None
    } | dict(generation or {})

    writer = ArtifactWriter(
        output,
        architecture=arch,
        config=config,
        metadata=metadata(name or path.stem, str(path)),
        generation=generation,
        tokenizer=tokenizer,
    )
    targets = {}
    for tensor_name, shape in shapes.items():
        targets[tensor_name] = _target_dtype(sources[tensor_name].tensor_type, shape, dtype)
        writer.declare(tensor_name, targets[tensor_name], shape)
    writer.add_resource("tokenizer.json", tokenizer_json)
    template = meta.get("tokenizer.chat_template")
    if template:
        writer.add_resource("chat_template.jinja", template.encode("utf-8"))
    writer.add_resource("config.json", json.dumps(hf_config, indent=2).encode())
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    try:
        writer.begin()
        total = sum(int(t.n_bytes) for t in sources.values())
        with progress_bar(total, f"converting {path.name}", enabled=progress) as bar:
            for tensor_name, shape in shapes.items():
                tensor = sources[tensor_name]
                rows, source = _source_rows(tensor)
                projection = tensor_name.rsplit(".", 2)[-2]
                if arch == "llama" and projection in heads and len(shape) == 2:
                    rows = rows[unpermute_rows(shape[0], heads[projection])]
                for start, stop in row_ranges(shape):
                    writer.write_part(
                        tensor_name,
                        _encode_rows(
                            rows[start:stop], source, tensor.tensor_type, targets[tensor_name]
                        ),
                    )
                bar.update(int(tensor.n_bytes))
        return writer.close()
    except BaseException:
        writer.abort()
        raise
