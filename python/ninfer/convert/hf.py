"""Hugging Face safetensors folder → .ninfer (Llama, Qwen2, Qwen3 dense; Qwen3.5/3.6 hybrid).

Conversion is two steps: `plan_hf_conversion` reads only config.json and the safetensors
headers and decides every artifact tensor's source, dtype and shape (so a plan can be shown
or checked without touching weights); `convert_hf_folder` then streams the tensors out.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer.artifact import ArtifactWriter
from ninfer.convert.header_fields import generation_defaults, metadata, tokenizer_section
from ninfer.convert.model_config import (
    UnsupportedModelError,
    architecture_of,
    expected_tensors,
    normalize_config,
)
from ninfer.convert.progress import progress_bar
from ninfer.convert.quantized_checkpoint import QuantizedStored, attach_quantized
from ninfer.convert.qwen3_5_config import (
    hybrid_architecture_of,
    normalize_qwen3_5_config,
    qwen3_5_expected_tensors,
)
from ninfer.convert.qwen3_5_tensors import (
    CheckpointLayoutError,
    Direct,
    Source,
    StackedExperts,
    plan_qwen3_5_tensors,
)
from ninfer.convert.safetensors_folder import CheckpointError, StoredTensor, read_checkpoint
from ninfer.convert.tensor_encoder import TensorEncoder
from ninfer.convert.tensors import stored_dtype

CheckpointTensor = StoredTensor | QuantizedStored

log = logging.getLogger("ninfer.convert")

# Buffers some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: malformed JSON: {e}") from e


def chat_template_of(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """chat_template.jinja, or tokenizer_config.json's chat_template (the 'default' if named)."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


@dataclass(frozen=True)
class PlannedTensor:
    source: Source  # checkpoint tensor(s) it is made of
    source_dtype: str  # f32 | f16 | bf16 | fp8 | nvfp4: the encoding `keep` preserves
    dtype: str  # stored dtype in the artifact
    shape: tuple[int, ...]


@dataclass
class ConversionPlan:
    architecture: str
    config: dict[str, Any]  # normalized header config
    hf_config: dict[str, Any]  # config.json as read
    tensors: dict[str, PlannedTensor]  # artifact name → plan, in artifact order
    stored: dict[str, CheckpointTensor]  # checkpoint tensor table (quantized weights folded)
    notes: list[str]  # facts worth telling the user (skipped tensors, adjusted fields)


def _source_dtype(source: Source, stored: dict[str, CheckpointTensor]) -> str:
    names = [source.name] if isinstance(source, Direct) else [n for e in source.parts for n in e]
    dtypes = {stored[n].dtype for n in names}
    if len(dtypes) == 1:
        return dtypes.pop()
    if dtypes <= {"fp8", "bf16", "f16", "f32"} and "fp8" in dtypes:
        return "fp8"  # a stack of FP8 experts with a bf16 straggler: keep it FP8
    return "f32"  # mixed parts: widen, never round


def _plan_dense(folder: Path, architecture: str, hf_config: dict[str, Any],
                stored: dict[str, CheckpointTensor]) -> tuple[dict[str, Any], dict[str, Source]]:
    config = normalize_config(architecture, hf_config)
    shapes = expected_tensors(config)
    missing = [n for n in shapes if n not in stored]
    if missing:
        raise UnsupportedModelError(f"{folder}: checkpoint lacks tensors {missing[:5]}")
    unexpected = [
        n for n in stored
        if n not in shapes and not n.endswith(_IGNORED_SUFFIXES)
        and not (n == "lm_head.weight" and config["tie_word_embeddings"])
    ]
    if unexpected:
        raise UnsupportedModelError(f"{folder}: unexpected tensors {unexpected[:5]}")
    for tensor_name, shape in shapes.items():
        if stored[tensor_name].shape != shape:
            raise UnsupportedModelError(
                f"{folder}: tensor {tensor_name} has shape {list(stored[tensor_name].shape)}, "
                f"config implies {list(shape)}"
            )
    return config, {n: Direct(n) for n in shapes}


def _plan_hybrid(folder: Path, architecture: str, hf_config: dict[str, Any],
                 stored: dict[str, CheckpointTensor],
                 notes: list[str]) -> tuple[dict[str, Any], dict[str, Source]]:
    config = normalize_qwen3_5_config(architecture, hf_config)
    shapes = {n: t.shape for n, t in stored.items() if not n.endswith(_IGNORED_SUFFIXES)}
    if config["tie_word_embeddings"]:
        shapes.pop("lm_head.weight", None)  # a tied export may still carry a copy
    if config["mtp_num_hidden_layers"] and not any(n.startswith("mtp.") for n in shapes):
        # transformers' save_pretrained drops the MTP head (HF has no MTP module); the model
        # is complete without it, only speculative decoding is unavailable.
        notes.append(f"checkpoint has no mtp.* tensors: stored with mtp_num_hidden_layers=0 "
                     f"(config.json says {config['mtp_num_hidden_layers']})")
        config["mtp_num_hidden_layers"] = 0
    try:
        plan = plan_qwen3_5_tensors(shapes, config)
    except CheckpointLayoutError as e:
        raise UnsupportedModelError(f"{folder}: {e}") from e
    if plan.skipped_vision:
        notes.append(f"skipped {len(plan.skipped_vision)} vision tensors (the artifact holds "
                     "the text model)")
    if any(isinstance(s, StackedExperts) for s in plan.sources.values()):
        notes.append("per-expert MoE tensors stacked into mlp.experts.{gate_up,down}_proj")
    return config, plan.sources


def plan_hf_conversion(folder: str | Path, *, dtype: str = "keep") -> ConversionPlan:
    """Read config.json and the safetensors headers of `folder` and plan every tensor."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{folder}: no config.json (not a Hugging Face model folder)")
    hf_config = _read_json(config_path)
    stored = attach_quantized(read_checkpoint(folder), hf_config)
    notes: list[str] = []
    hybrid = hybrid_architecture_of(hf_config)
    if hybrid is not None:
        architecture = hybrid
        config, sources = _plan_hybrid(folder, hybrid, hf_config, stored, notes)
    else:
        architecture = architecture_of(hf_config)
        config, sources = _plan_dense(folder, architecture, hf_config, stored)
    shapes = qwen3_5_expected_tensors(config) if hybrid else expected_tensors(config)
    tensors = {}
    for name, source in sources.items():
        source_dtype = _source_dtype(source, stored)
        shape = tuple(shapes[name])
        tensors[name] = PlannedTensor(source, source_dtype,
                                      stored_dtype(shape, source_dtype, dtype, name), shape)
    return ConversionPlan(architecture, config, hf_config, tensors, stored, notes)


def _write_tensor(writer: ArtifactWriter, name: str, planned: PlannedTensor,
                  stored: dict[str, CheckpointTensor]) -> int:
    """Stream one planned tensor into the writer; returns the checkpoint bytes read."""
    source = planned.source
    parts = [[source.name]] if isinstance(source, Direct) else source.parts
    read = 0
    # A stack is written expert by expert, part by part: row blocks along the leading axes
    # are contiguous in the stacked layout, so no expert stack is ever held in memory.
    encoder = TensorEncoder(writer, name, planned.dtype, planned.shape)
    for expert in parts:
        for part in expert:
            tensor = stored[part]
            if isinstance(tensor, QuantizedStored):
                encoder.add_quantized(tensor)
            else:
                encoder.add_array(tensor.array(), tensor.dtype)
            read += tensor.nbytes
    encoder.finish()
    return read


def checkpoint_names(plan: ConversionPlan) -> list[str]:
    """Every checkpoint tensor the plan reads."""
    names = []
    for planned in plan.tensors.values():
        source = planned.source
        names += [source.name] if isinstance(source, Direct) else [n for e in source.parts
                                                                   for n in e]
    return names


def convert_hf_folder(
    folder: str | Path,
    output: str | Path,
    *,
    dtype: str = "keep",
    progress: bool = True,
    name: str | None = None,
) -> Path:
    folder = Path(folder)
    plan = plan_hf_conversion(folder, dtype=dtype)
    for note in plan.notes:
        log.info("%s: %s", folder.name, note)
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise CheckpointError(f"{folder}: no tokenizer.json (slow-only tokenizers unsupported)")
    tokenizer_bytes = tokenizer_path.read_bytes()
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    generation_path = folder / "generation_config.json"
    generation_config = _read_json(generation_path)

    writer = ArtifactWriter(
        output,
        architecture=plan.architecture,
        config=plan.config,
        metadata=metadata(name or folder.name, str(folder)),
        generation=generation_defaults(generation_config),
        tokenizer=tokenizer_section(
            json.loads(tokenizer_bytes), tokenizer_config,
            _text_fields(plan.hf_config), generation_config
        ),
    )
    for tensor_name, planned in plan.tensors.items():
        writer.declare(tensor_name, planned.dtype, planned.shape)
    writer.add_resource("tokenizer.json", tokenizer_bytes)
    template = chat_template_of(folder, tokenizer_config)
    if template is not None:
        writer.add_resource("chat_template.jinja", template.encode("utf-8"))
    if generation_path.exists():
        writer.add_resource("generation_config.json", generation_path.read_bytes())
    writer.add_resource("config.json", (folder / "config.json").read_bytes())
    try:
        writer.begin()
        total = sum(plan.stored[n].nbytes for n in checkpoint_names(plan))
        with progress_bar(total, f"converting {folder.name}", enabled=progress) as bar:
            for tensor_name, planned in plan.tensors.items():
                bar.update(_write_tensor(writer, tensor_name, planned, plan.stored))
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def _text_fields(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Token-id fields (bos/eos/pad) of the decoder: multimodal configs nest them in text_config."""
    text = hf_config.get("text_config")
    if not isinstance(text, dict):
        return hf_config
    return {**hf_config, **{k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                            if text.get(k) is not None}}
