"""Streaming one artifact tensor into its stored dtype, part after part, row block after row
block, including the block-quantized formats (fp8, nvfp4) whose scales follow the codes.

A tensor is fed in order: plain arrays in a source encoding (`add_array`), or quantized
checkpoint weights (`add_quantized`), whose codes and scales are copied unchanged when the
stored format is theirs and the block grid lines up, else dequantized and re-encoded.
"""

from __future__ import annotations

import numpy as np

from ninfer.artifact import ArtifactWriter
from ninfer.artifact.block_quant import (
    fp8_block_scales,
    fp8_encode_block,
    nvfp4_encode_rows,
)
from ninfer.artifact.layout import FP8_BLOCK, quantized_layout
from ninfer.convert.quantized_checkpoint import QuantizedStored
from ninfer.convert.tensors import QUANTIZED_DTYPES, encode, row_chunks, to_f32


class TensorEncoder:
    def __init__(self, writer: ArtifactWriter, name: str, target: str, shape: tuple[int, ...]):
        self.writer, self.name, self.target = writer, name, target
        self.quantized = target in QUANTIZED_DTYPES
        self.group_rows = 0
        if self.quantized:
            self.layout = quantized_layout(target, shape)
            self.cols = self.layout["cols"]
            self.group_rows = self.layout["group_rows"]
        self.rows_done = 0  # rows whose codes are written
        self.pending: list[np.ndarray] = []  # fp8: f32 rows of an unfinished 128-row block
        self.pending_rows = 0
        self.scales: list[np.ndarray] = []  # fp8 block scales / nvfp4 group scales, in order
        self.row_scales: list[np.ndarray] = []  # nvfp4

    # -- input ---------------------------------------------------------------------------

    def add_array(self, array: np.ndarray, source: str) -> None:
        """Rows (leading axes) of the tensor in the `source` encoding (f32, f16, bf16 bits)."""
        for chunk in row_chunks(array):
            if not self.quantized:
                self.writer.write_part(self.name, encode(chunk, source, self.target))
            else:
                self._add_f32(to_f32(chunk, source).reshape(-1, self.cols))

    def add_quantized(self, tensor: QuantizedStored) -> None:
        n, _ = tensor.shape
        if tensor.dtype == self.target == "nvfp4":
            packed, s16, g = tensor.nvfp4_parts()
            self._write_codes(np.ascontiguousarray(packed), n)
            self.scales.append(np.ascontiguousarray(s16))
            self.row_scales.append(np.full(n, g, dtype=np.float32))
            return
        position = (
            (self.rows_done + self.pending_rows) % max(self.group_rows, 1) if self.quantized else 0
        )
        aligned = (
            not self.pending
            and position % FP8_BLOCK == 0
            and (n % FP8_BLOCK == 0 or position + n == self.group_rows)
        )
        if tensor.dtype == self.target == "fp8" and aligned:
            self._write_codes(np.ascontiguousarray(tensor.raw_codes()), n)
            self.scales.append(tensor.fp8_block_scales())
            return
        self.add_array(tensor.f32(), "f32")

    # -- output --------------------------------------------------------------------------

    def finish(self) -> None:
        if not self.quantized:
            return
        self._flush_fp8_block()
        layout = self.layout
        if self.rows_done != layout["rows"]:
            raise ValueError(
                f"tensor {self.name!r}: {self.rows_done} of {layout['rows']} rows given"
            )
        scales = (
            np.concatenate([s.reshape(-1) for s in self.scales]) if self.scales else np.zeros(0)
        )
        if self.target == "fp8":
            self._pad_to(layout["scale_offset"])
            self.writer.write_part(self.name, scales.astype("<f4").view(np.uint8))
        else:
            self.writer.write_part(self.name, scales.astype(np.uint8))
            self._pad_to(layout["scale2_offset"])
            row_scales = np.concatenate(self.row_scales).astype("<f4")
            self.writer.write_part(self.name, row_scales.view(np.uint8))

    # -- internals -----------------------------------------------------------------------

    def _add_f32(self, rows: np.ndarray) -> None:
        if self.target == "nvfp4":
            packed, s16, row_scale = nvfp4_encode_rows(rows)
            self._write_codes(packed, rows.shape[0])
            self.scales.append(s16)
            self.row_scales.append(row_scale)
            return
        start = 0
        while start < rows.shape[0]:
            position = (self.rows_done + self.pending_rows) % self.group_rows
            block_end = min(self.group_rows, (position // FP8_BLOCK + 1) * FP8_BLOCK)
            take = min(block_end - position, rows.shape[0] - start)
            self.pending.append(rows[start : start + take])
            self.pending_rows += take
            start += take
            if position + take == block_end:
                self._flush_fp8_block()

    def _flush_fp8_block(self) -> None:
        if not self.pending:
            return
        block = np.concatenate(self.pending)
        self.pending, self.pending_rows = [], 0
        scales = fp8_block_scales(block)
        self._write_codes(fp8_encode_block(block, scales), block.shape[0])
        self.scales.append(scales)

    def _write_codes(self, codes: np.ndarray, rows: int) -> None:
        self.writer.write_part(self.name, np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1))
        self.rows_done += rows

    def _pad_to(self, offset: int) -> None:
        written = self.writer.bytes_written(self.name)
        if offset > written:
            self.writer.write_part(self.name, np.zeros(offset - written, dtype=np.uint8))
