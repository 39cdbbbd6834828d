"""Streaming .ninfer writer.

Every tensor is declared (name, dtype, shape) before any data is written, so all offsets and
the header are known up front: the header goes first, then each tensor is written straight to
its place in the file as it is produced. No more than one tensor is ever held in memory, which
is what lets a 27B-shaped random artifact be built on a small machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.artifact.layout import (
    DTYPES,
    FORMAT_VERSION,
    FP8_BLOCK,
    NVFP4_GROUP,
    align_up,
    data_offset,
    pack_preamble,
    quantized_layout,
    tensor_nbytes,
)

_NUMPY_DTYPES = {
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),  # bit patterns
    "q8_0": np.dtype("u1"),  # raw blocks
    "i32": np.dtype("<i4"),
    "fp8": np.dtype("u1"),  # codes then scales (layout.quantized_layout)
    "nvfp4": np.dtype("u1"),
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)

    @property
    def quant(self) -> dict[str, Any] | None:
        if self.dtype == "q8_0":
            return {"scheme": "q8_0", "block": 32}
        if self.dtype in ("fp8", "nvfp4"):
            layout = quantized_layout(self.dtype, self.shape)
            if self.dtype == "fp8":
                return {"scheme": "fp8_block", "block": [FP8_BLOCK, FP8_BLOCK],
                        "scale_dtype": "f32", "scale_offset": layout["scale_offset"]}
            return {"scheme": "nvfp4", "group": NVFP4_GROUP, "scale_dtype": "e4m3",
                    "scale_offset": layout["scale_offset"], "scale2_dtype": "f32",
                    "scale2_offset": layout["scale2_offset"]}
        return None


class ArtifactWriter:
    """One artifact: declare tensors/resources, `begin()`, `write()` each tensor, `close()`.

    The file appears at `path` only when `close()` succeeds (it is written to `path.partial`
    first), so an interrupted conversion never leaves a plausible-looking artifact behind.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        architecture: str,
        config: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        generation: dict[str, Any] | None = None,
        tokenizer: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._fields: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "metadata": metadata or {},
            "architecture": architecture,
            "config": config,
            "generation": generation or {},
            "tokenizer": tokenizer or {},
        }
        self._specs: dict[str, TensorSpec] = {}
        self._resources: dict[str, bytes] = {}
        self._offsets: dict[str, int] = {}
        self._progress: dict[str, int] = {}  # bytes written per tensor
        self._file: Any = None
        self._data_start = 0

    # -- declaration -----------------------------------------------------------------------

    def declare(self, name: str, dtype: str, shape: tuple[int, ...] | list[int]) -> TensorSpec:
        self._require_not_begun()
        if name in self._specs:
            raise ValueError(f"tensor {name!r} declared twice")
        if dtype not in DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
        spec = TensorSpec(name, dtype, tuple(int(d) for d in shape))
        spec.nbytes  # noqa: B018 -- validates the shape for the dtype now, not at write time
        self._specs[name] = spec
        return spec

    def add_resource(self, name: str, data: bytes) -> None:
        self._require_not_begun()
        if name in self._resources:
            raise ValueError(f"resource {name!r} added twice")
        self._resources[name] = bytes(data)

    @property
    def specs(self) -> dict[str, TensorSpec]:
        return dict(self._specs)

    # -- writing ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Lay out the data section, write the preamble, header and resources."""
        self._require_not_begun()
        tensors: dict[str, Any] = {}
        cursor = 0
        for spec in self._specs.values():
            self._offsets[spec.name] = cursor
            tensors[spec.name] = {
                "dtype": spec.dtype,
                "shape": list(spec.shape),
                "offset": cursor,
                "nbytes": spec.nbytes,
                "quant": spec.quant,
            }
            cursor = align_up(cursor + spec.nbytes)
        resources: dict[str, Any] = {}
        resource_offsets: dict[str, int] = {}
        for name, data in self._resources.items():
            resource_offsets[name] = cursor
            resources[name] = {"offset": cursor, "size": len(data)}
            cursor = align_up(cursor + len(data))
        header = dict(self._fields, tensors=tensors, resources=resources, data_size=cursor)
        header_bytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
        self._data_start = data_offset(len(header_bytes))

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._partial, "wb")  # noqa: SIM115 -- closed in close()/abort()
        self._file.write(pack_preamble(header_bytes))
        self._file.write(header_bytes)
        self._file.truncate(self._data_start + cursor)  # sparse zero padding everywhere
        for name, data in self._resources.items():
            self._file.seek(self._data_start + resource_offsets[name])
            self._file.write(data)

    def write(self, name: str, data: np.ndarray | bytes | memoryview) -> None:
        """Write one declared tensor whole: a numpy array of its stored element type or bytes."""
        if self._progress.get(name):
            raise ValueError(f"tensor {name!r} written twice")
        buffer = self._buffer(name, data)
        spec = self._specs[name]
        if buffer.nbytes != spec.nbytes:
            raise ValueError(
                f"tensor {name!r}: {buffer.nbytes} bytes given, {spec.dtype} {list(spec.shape)} "
                f"needs {spec.nbytes}"
            )
        self._append(name, buffer)

    def write_part(self, name: str, data: np.ndarray | bytes | memoryview) -> None:
        """Append the next consecutive bytes of a tensor (e.g. a block of rows)."""
        buffer = self._buffer(name, data)
        spec = self._specs[name]
        if self._progress.get(name, 0) + buffer.nbytes > spec.nbytes:
            raise ValueError(f"tensor {name!r}: more than its {spec.nbytes} bytes written")
        self._append(name, buffer)

    def bytes_written(self, name: str) -> int:
        return self._progress.get(name, 0)

    def _buffer(self, name: str, data: np.ndarray | bytes | memoryview) -> memoryview:
        if self._file is None:
            raise RuntimeError("ArtifactWriter.begin() must be called before writing tensors")
        spec = self._specs.get(name)
        if spec is None:
            raise KeyError(f"tensor {name!r} was not declared")
        if isinstance(data, np.ndarray):
            expected = _NUMPY_DTYPES[spec.dtype]
            if data.dtype != expected:
                raise TypeError(f"tensor {name!r}: expected numpy {expected}, got {data.dtype}")
            return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        return memoryview(data).cast("B")

    def _append(self, name: str, buffer: memoryview) -> None:
        done = self._progress.get(name, 0)
        self._file.seek(self._data_start + self._offsets[name] + done)
        self._file.write(buffer)
        self._progress[name] = done + buffer.nbytes

    def close(self) -> Path:
        if self._file is None:
            raise RuntimeError("ArtifactWriter.begin() was never called")
        missing = [
            name for name, spec in self._specs.items() if self._progress.get(name, 0) != spec.nbytes
        ]
        if missing:
            self.abort()
            raise ValueError(f"tensors declared but not fully written: {', '.join(missing[:5])}")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self._partial, self.path)
        return self.path

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif self._file is not None:
            self.close()

    def _require_not_begun(self) -> None:
        if self._file is not None or self._offsets:
            raise RuntimeError("the artifact layout is fixed once begin() was called")
