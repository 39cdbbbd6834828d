"""Byte layout of a .ninfer file (version 1), shared by the Python writer and reader.

offset 0   8 bytes  magic b"NINFER\\x1a\\n"
offset 8   u32 LE   format version
offset 12  u32 LE   reserved (0)
offset 16  u64 LE   header length in bytes (UTF-8 JSON)
offset 24  u32 LE   CRC-32 (zlib) of the header bytes
offset 28  u32 LE   reserved (0)
offset 32  header JSON, zero padding to a 256-byte boundary, then the data section.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"NINFER\x1a\n"
FORMAT_VERSION = 1
ALIGNMENT = 256
PREAMBLE_SIZE = 32
Q8_0_BLOCK = 32
Q8_0_BLOCK_BYTES = 34

_PREAMBLE = struct.Struct("<8sIIQII")
assert _PREAMBLE.size == PREAMBLE_SIZE

DTYPES = ("f32", "f16", "bf16", "q8_0", "i32")
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}


class ArtifactFormatError(ValueError):
    """A file that is not a usable .ninfer artifact; the message names the file and problem."""


def align_up(value: int, alignment: int = ALIGNMENT) -> int:
    return (value + alignment - 1) // alignment * alignment


def tensor_nbytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Stored bytes of a tensor of `dtype` and logical `shape` (q8_0 blocks: last axis)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown tensor dtype {dtype!r} (known: {', '.join(DTYPES)})")
    if len(shape) == 0:
        raise ValueError("tensors need at least one dimension")
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {list(shape)}")
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    cols = int(shape[-1])
    if dtype == "q8_0":
        if cols % Q8_0_BLOCK:
            raise ValueError(f"q8_0 needs a last dimension divisible by {Q8_0_BLOCK}, got {cols}")
        return rows * (cols // Q8_0_BLOCK) * Q8_0_BLOCK_BYTES
    return rows * cols * _ELEMENT_BYTES[dtype]


def data_offset(header_len: int) -> int:
    return align_up(PREAMBLE_SIZE + header_len)


def pack_preamble(header: bytes) -> bytes:
    return _PREAMBLE.pack(MAGIC, FORMAT_VERSION, 0, len(header), zlib.crc32(header), 0)


def unpack_preamble(raw: bytes) -> tuple[bytes, int, int, int]:
    """(magic, version, header_len, header_crc) of the first PREAMBLE_SIZE bytes."""
    magic, version, _, header_len, crc, _ = _PREAMBLE.unpack(raw)
    return magic, version, header_len, crc
