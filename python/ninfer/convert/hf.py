"""Hugging Face safetensors folder → .ninfer (Llama, Qwen2, Qwen3 dense)."""

from __future__ import annotations

import json
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
from ninfer.convert.safetensors_folder import CheckpointError, read_checkpoint
from ninfer.convert.tensors import stored_dtype, write_encoded

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


def convert_hf_folder(
    folder: str | Path,
    output: str | Path,
    *,
    dtype: str = "keep",
    progress: bool = True,
    name: str | None = None,
) -> Path:
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{folder}: no config.json (not a Hugging Face model folder)")
    hf_config = _read_json(config_path)
    architecture = architecture_of(hf_config)
    config = normalize_config(architecture, hf_config)
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise CheckpointError(f"{folder}: no tokenizer.json (slow-only tokenizers unsupported)")
    tokenizer_bytes = tokenizer_path.read_bytes()
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    generation_path = folder / "generation_config.json"
    generation_config = _read_json(generation_path)

    stored = read_checkpoint(folder)
    shapes = expected_tensors(config)
    missing = [n for n in shapes if n not in stored]
    if missing:
        raise UnsupportedModelError(f"{folder}: checkpoint lacks tensors {missing[:5]}")
    unexpected = [
        n
        for n in stored
        if n not in shapes
        and not n.endswith(_IGNORED_SUFFIXES)
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

    writer = ArtifactWriter(
        output,
        architecture=architecture,
        config=config,
        metadata=metadata(name or folder.name, str(folder)),
        generation=generation_defaults(generation_config),
        tokenizer=tokenizer_section(
            json.loads(tokenizer_bytes), tokenizer_config, hf_config, generation_config
        ),
    )
    targets = {}
    for tensor_name, shape in shapes.items():
        targets[tensor_name] = stored_dtype(shape, stored[tensor_name].dtype, dtype)
        writer.declare(tensor_name, targets[tensor_name], shape)
    writer.add_resource("tokenizer.json", tokenizer_bytes)
    template = chat_template_of(folder, tokenizer_config)
    if template is not None:
        writer.add_resource("chat_template.jinja", template.encode("utf-8"))
    if generation_path.exists():
        writer.add_resource("generation_config.json", generation_path.read_bytes())
    writer.add_resource("config.json", config_path.read_bytes())
    try:
        writer.begin()
        total = sum(stored[n].nbytes for n in shapes)
        with progress_bar(total, f"converting {folder.name}", enabled=progress) as bar:
            for tensor_name in shapes:
                source = stored[tensor_name]
                write_encoded(
                    writer, tensor_name, source.array(), source.dtype, targets[tensor_name]
                )
                bar.update(source.nbytes)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
