"""Pure-Python reader of a .ninfer header, for tools that do not need the native core."""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.block_quant import dequantize_fp8, dequantize_nvfp4
from ninfer.artifact.layout import (
    ALIGNMENT,
    FORMAT_VERSION,
    MAGIC,
    PREAMBLE_SIZE,
    ArtifactFormatError,
    data_offset,
    tensor_nbytes,
    unpack_preamble,
)
from ninfer.artifact.numerics import bf16_bits_to_f32, dequantize_q8_0


@dataclass
class ArtifactHeader:
    path: Path
    header: dict[str, Any]
    data_offset: int
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return self.header["architecture"]

    @property
    def config(self) -> dict[str, Any]:
        return self.header["config"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.get("metadata") or {}

    def resource(self, name: str) -> bytes:
        entry = self.resources.get(name)
        if entry is None:
            raise KeyError(f"artifact '{self.path}' has no resource {name!r}")
        with open(self.path, "rb") as f:
            f.seek(self.data_offset + entry["offset"])
            return f.read(entry["size"])

    def has_resource(self, name: str) -> bool:
        return name in self.resources

    def tensor_bytes(self, name: str) -> np.ndarray:
        """Read-only uint8 memory map of one tensor's stored bytes."""
        entry = self.tensors[name]
        if entry["nbytes"] == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(
            self.path,
            dtype=np.uint8,
            mode="r",
            offset=self.data_offset + entry["offset"],
            shape=(entry["nbytes"],),
        )

    def tensor(self, name: str) -> np.ndarray:
        """Read-only map in the stored encoding: f32/f16/i32 as such, bf16 as uint16 bits,
        q8_0 as uint8 blocks of shape [..., cols / 32 * 34], fp8 and nvfp4 as their flat
        bytes (codes, then scales)."""
        entry = self.tensors[name]
        if entry["dtype"] in ("fp8", "nvfp4"):
            return self.tensor_bytes(name)
        shape = list(entry["shape"])
        if entry["dtype"] == "q8_0":
            shape[-1] = shape[-1] // 32 * 34
        return self.tensor_bytes(name).view(_STORED_NUMPY[entry["dtype"]]).reshape(shape)

    def tensor_f32(self, name: str) -> np.ndarray:
        """A float32 copy of one tensor, decoded from its stored format."""
        entry = self.tensors[name]
        stored = self.tensor(name)
        if entry["dtype"] == "bf16":
            return bf16_bits_to_f32(stored)
        if entry["dtype"] == "q8_0":
            return dequantize_q8_0(stored, entry["shape"])
        if entry["dtype"] == "fp8":
            return dequantize_fp8(stored, entry["shape"])
        if entry["dtype"] == "nvfp4":
            return dequantize_nvfp4(stored, entry["shape"])
        return np.array(stored, dtype=np.float32)


_STORED_NUMPY = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2"),
                 "q8_0": np.dtype("u1"), "i32": np.dtype("<i4")}


def read_header(path: str | os.PathLike[str]) -> ArtifactHeader:
    """Parse and validate the preamble and header of an artifact (tensor data is not read)."""
    path = Path(path)

    def fail(problem: str) -> ArtifactFormatError:
        return ArtifactFormatError(f"artifact '{path}': {problem}")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            preamble = f.read(PREAMBLE_SIZE)
            if len(preamble) < PREAMBLE_SIZE:
                raise fail(f"file too short ({size} bytes) for the {PREAMBLE_SIZE}-byte preamble")
            magic, version, header_len, crc = unpack_preamble(preamble)
            if magic != MAGIC:
                raise fail("wrong magic: not a .ninfer artifact")
            if version != FORMAT_VERSION:
                raise fail(f"unknown format version {version} (this reader knows {FORMAT_VERSION})")
            if header_len > size - PREAMBLE_SIZE:
                raise fail(f"file too short: header of {header_len} bytes extends past the end")
            raw = f.read(header_len)
    except OSError as e:
        raise fail(f"cannot read: {e.strerror or e}") from e
    if zlib.crc32(raw) != crc:
        raise fail("header CRC-32 mismatch: the header is corrupted")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise fail(f"malformed header JSON: {e}") from e
    if not isinstance(header, dict):
        raise fail("header JSON is not an object")
    start = data_offset(header_len)
    data_size = header.get("data_size")
    if not isinstance(data_size, int) or data_size < 0:
        raise fail("header lacks a valid data_size")
    if start + data_size > size:
        raise fail(f"file too short: data section needs {start + data_size} bytes, has {size}")
    tensors = header.get("tensors")
    resources = header.get("resources") or {}
    if not isinstance(tensors, dict) or not isinstance(resources, dict):
        raise fail("header 'tensors'/'resources' must be objects")
    for name, entry in tensors.items():
        if not isinstance(entry, dict):
            raise fail(f"tensor {name!r} entry is not an object")
        _check_extent(fail, f"tensor {name!r}", entry.get("offset"), entry.get("nbytes"), data_size)
        if entry["offset"] % ALIGNMENT:
            raise fail(f"tensor {name!r} offset {entry['offset']} is not {ALIGNMENT}-byte aligned")
        try:
            expected = tensor_nbytes(entry.get("dtype"), entry.get("shape"))
        except (TypeError, ValueError) as e:
            raise fail(f"tensor {name!r}: {e}") from e
        if expected != entry["nbytes"]:
            raise fail(f"tensor {name!r} has nbytes {entry['nbytes']}, its shape needs {expected}")
    for name, entry in resources.items():
        if not isinstance(entry, dict):
            raise fail(f"resource {name!r} entry is not an object")
        _check_extent(fail, f"resource {name!r}", entry.get("offset"), entry.get("size"), data_size)
    return ArtifactHeader(path, header, start, tensors, resources)


def _check_extent(fail: Any, what: str, offset: Any, size: Any, data_size: int) -> None:
    if not isinstance(offset, int) or not isinstance(size, int) or offset < 0 or size < 0:
        raise fail(f"{what} has an invalid offset/size")
    if offset + size > data_size:
        raise fail(f"{what} lies outside the data section")
