"""Test helper: an f32 artifact of another artifact's decoded values (its "twin")."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ninfer.artifact import ArtifactWriter, read_header


def f32_twin(artifact: Path, path: Path) -> Path:
    """Writes every tensor of `artifact` as f32 of its decoded values (quantized ones
    dequantized), with the same config, metadata and tokenizer, to `path`."""
    header = read_header(artifact)
    writer = ArtifactWriter(
        path,
        architecture=header.architecture,
        config=header.config,
        metadata=header.metadata,
        tokenizer=header.header["tokenizer"],
    )
    for name, entry in header.tensors.items():
        writer.declare(name, "f32", entry["shape"])
    writer.add_resource("tokenizer.json", header.resource("tokenizer.json"))
    writer.begin()
    for name in header.tensors:
        writer.write(name, np.ascontiguousarray(header.tensor_f32(name), dtype=np.float32))
    return writer.close()
