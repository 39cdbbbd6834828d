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

DTYPES = ("f32", "f16", "bf16", "q8_0", "i32", "fp8", "nvfp4")
FP8_BLOCK = 128  # fp8: e4m3 codes with one f32 scale per 128×128 block of each matrix
NVFP4_GROUP = 16  # nvfp4: e2m1 codes, an e4m3 scale per 16 values and an f32 scale per row
_ELEMENT_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}


class ArtifactFormatError(ValueError):
    """A file that is not a usable .ninfer artifact; the message names the file and problem."""


def align_up(value: int, alignment: int = ALIGNMENT) -> int:
    return (value + alignment - 1) // alignment * alignment


def quantized_layout(dtype: str, shape: tuple[int, ...] | list[int]) -> dict[str, int]:
    """Byte offsets of the parts of an fp8 or nvfp4 tensor (docs/artifact-format.md).

    The last axis is K, the one before it the rows of one matrix ("group": a stacked
    [E, N, K] tensor has E groups of N rows); fp8 block scales restart at each group.
    """
    if len(shape) < 2:
        raise ValueError(f"{dtype} needs a matrix, got shape {list(shape)}")
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    cols, group_rows = int(shape[-1]), int(shape[-2])
    if dtype == "fp8":
        if cols % 16:
            raise ValueError(f"fp8 needs a last dimension divisible by 16, got {cols}")
        groups = rows // group_rows if group_rows else 0
        row_blocks = -(-group_rows // FP8_BLOCK)
        col_blocks = -(-cols // FP8_BLOCK)
        scale_offset = align_up(rows * cols, 16)
        scale_count = groups * row_blocks * col_blocks
        return {"rows": rows, "cols": cols, "group_rows": group_rows, "codes": rows * cols,
                "scale_offset": scale_offset, "scale_count": scale_count,
                "row_blocks": row_blocks, "col_blocks": col_blocks,
                "nbytes": scale_offset + 4 * scale_count}
    if dtype == "nvfp4":
        if cols % 32:
            raise ValueError(f"nvfp4 needs a last dimension divisible by 32, got {cols}")
        codes = rows * cols // 2
        scale_offset = codes
        scale2_offset = align_up(codes + rows * cols // NVFP4_GROUP, 16)
        return {"rows": rows, "cols": cols, "group_rows": group_rows, "codes": codes,
                "scale_offset": scale_offset, "scale2_offset": scale2_offset,
                "nbytes": scale2_offset + 4 * rows}
    raise ValueError(f"{dtype} is not a block-quantized dtype")


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
    if dtype in ("fp8", "nvfp4"):
        return quantized_layout(dtype, shape)["nbytes"]
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
