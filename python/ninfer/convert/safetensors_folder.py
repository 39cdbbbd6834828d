"""Zero-copy access to the tensors of a safetensors checkpoint (one file or index-sharded).

The format is small enough to read directly: an 8-byte little-endian header length, a JSON
table {name: {dtype, shape, data_offsets: [begin, end]}}, then the raw data. Tensors come
back as numpy memory maps, bf16 as uint16 bit patterns (numpy has no bf16).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_DTYPES = {"F32": ("f32", "<f4"), "F16": ("f16", "<f2"), "BF16": ("bf16", "<u2"),
           # quantized releases (convert/quantized_checkpoint.py): raw bytes
           "F8_E4M3": ("f8_e4m3", "u1"), "U8": ("u8", "u1")}
_NUMPY_DTYPES = dict(_DTYPES.values())


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    dtype: str  # f32 | f16 | bf16 | f8_e4m3 | u8
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in `file`
    nbytes: int

    def array(self) -> np.ndarray:
        numpy_dtype = np.dtype(_NUMPY_DTYPES[self.dtype])
        if self.nbytes == 0:
            return np.zeros(self.shape, dtype=numpy_dtype)
        return np.memmap(
            self.file, dtype=numpy_dtype, mode="r", offset=self.begin, shape=self.shape or (1,)
        ).reshape(self.shape)

    def raw(self) -> np.ndarray:
        """The stored bytes as uint8 of the tensor's shape (for F8_E4M3 and U8 tensors)."""
        return np.asarray(self.array()).view(np.uint8)


def _read_file_table(path: Path) -> dict[str, StoredTensor]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise CheckpointError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > size - 8:
            raise CheckpointError(f"{path}: safetensors header length exceeds the file")
        try:
            table = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: malformed safetensors header: {e}") from e
    data_start = 8 + header_len
    tensors: dict[str, StoredTensor] = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        if name.endswith(".weight_packed"):
            raise CheckpointError(f"{path}: tensor {name!r}: compressed-tensors checkpoints are "
                                  "not supported (use Qwen's FP8 or a ModelOpt NVFP4 release)")
        if entry["dtype"] not in _DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} has dtype {entry['dtype']}; supported: "
                f"{', '.join(_DTYPES)}"
            )
        dtype, numpy_dtype = _DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(numpy_dtype).itemsize
        if end - begin != expected or data_start + end > size or begin < 0:
            raise CheckpointError(f"{path}: tensor {name!r} has inconsistent data offsets")
        tensors[name] = StoredTensor(path, dtype, shape, data_start + begin, end - begin)
    return tensors


def read_checkpoint(folder: Path) -> dict[str, StoredTensor]:
    """Tensor table of a folder holding model.safetensors or a sharded index."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        tensors: dict[str, StoredTensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = folder / shard
            if not shard_path.exists():
                raise CheckpointError(f"{folder}: shard {shard} named by the index is missing")
            tensors.update(_read_file_table(shard_path))
        absent = [name for name in weight_map if name not in tensors]
        if absent:
            raise CheckpointError(f"{folder}: index names tensors missing in shards: {absent[:3]}")
        return tensors
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for path in files:
        tensors.update(_read_file_table(path))
    return tensors
