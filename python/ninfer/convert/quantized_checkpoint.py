"""Quantized safetensors checkpoints: Qwen's FP8 releases and ModelOpt NVFP4.

A quantized weight arrives as several checkpoint tensors; `attach_quantized` folds them into
one logical tensor (its real [N, K] shape) so that planning sees the same names and shapes as
for a bf16 checkpoint:

- Qwen FP8: `X.weight` F8_E4M3 [N, K] and `X.weight_scale_inv` (bf16 or f32)
  [⌈N/128⌉, ⌈K/128⌉]: W = code · scale per 128×128 block.
- ModelOpt NVFP4: `X.weight` U8 [N, K/2] (even k in the low nibble), `X.weight_scale` F8_E4M3
  [N, K/16], `X.weight_scale_2` f32 (one value) and `X.input_scale` (for W4A4 kernels; W4A16
  does not use it): W = e2m1 · scale · scale_2.
- ModelOpt FP8 layers (its mixed-precision releases): `X.weight` F8_E4M3 [N, K] with an f32
  scalar `X.weight_scale` (and `input_scale`): one scale for the whole tensor.

Anything else quantized is refused with the tensor's name: an F8 weight without a scale (it
would load as garbage), other block sizes, compressed-tensors names (`weight_packed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ninfer.artifact.block_quant import E2M1_VALUES, e4m3_to_f32, unpack_e2m1
from ninfer.artifact.layout import FP8_BLOCK, NVFP4_GROUP
from ninfer.artifact.numerics import bf16_bits_to_f32
from ninfer.convert.safetensors_folder import CheckpointError, StoredTensor

_COMPANIONS = (".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale")
# Activation/KV calibration scales that W8A16/W4A16 weights and our dynamic KV scales ignore.
_IGNORED = (".input_scale", ".k_scale", ".v_scale", ".output_scale")


@dataclass(frozen=True)
class QuantizedStored:
    """One quantized checkpoint weight: its codes and scales, under its logical shape."""

    name: str
    dtype: str  # fp8 | nvfp4
    shape: tuple[int, int]  # logical [N, K]
    codes: StoredTensor
    scale: StoredTensor
    scale2: StoredTensor | None = None  # nvfp4: the per-tensor f32 scale

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.codes, self.scale, self.scale2) if t is not None)

    def fp8_block_scales(self) -> np.ndarray:
        """f32 [⌈N/128⌉, ⌈K/128⌉] block scales (a per-tensor scale broadcast to every block)."""
        n, k = self.shape
        values = _as_f32(self.scale)
        blocks = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
        if values.size == 1:
            return np.full(blocks, values.reshape(-1)[0], dtype=np.float32)
        return values.reshape(blocks).astype(np.float32)

    def raw_codes(self) -> np.ndarray:
        return self.codes.raw()

    def nvfp4_parts(self) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """(packed codes [N, K/2], e4m3 scale codes [N, K/16], the f32 tensor scale)."""
        assert self.scale2 is not None
        return self.codes.raw(), self.scale.raw(), np.float32(_as_f32(self.scale2).reshape(-1)[0])

    def f32(self) -> np.ndarray:
        """The dequantized weight."""
        n, k = self.shape
        if self.dtype == "fp8":
            codes = e4m3_to_f32(self.codes.raw())
            scales = np.repeat(np.repeat(self.fp8_block_scales(), FP8_BLOCK, 0), FP8_BLOCK, 1)
            return codes * scales[:n, :k]
        packed, s16, g = self.nvfp4_parts()
        values = E2M1_VALUES[unpack_e2m1(packed)].reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
        return (values * (e4m3_to_f32(s16)[:, :, None] * g)).reshape(n, k)


def _as_f32(t: StoredTensor) -> np.ndarray:
    array = np.asarray(t.array())
    return bf16_bits_to_f32(array) if t.dtype == "bf16" else array.astype(np.float32)


_MODELOPT_ALGOS = ("NVFP4", "FP8", "MIXED_PRECISION")


def _block_size(hf_config: dict[str, Any]) -> list[int] | None:
    q = hf_config.get("quantization_config") or {}
    block = q.get("weight_block_size")
    return [int(b) for b in block] if block else None


def _check_quantization_config(hf_config: dict[str, Any]) -> None:
    """Refuse declared schemes this converter does not read, before looking at tensors."""
    q = hf_config.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        raise CheckpointError("quantization_config.quant_method 'compressed-tensors' is not "
                              "supported (use Qwen's FP8 or a ModelOpt NVFP4 release)")
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo not in _MODELOPT_ALGOS:
            raise CheckpointError(f"ModelOpt quant_algo {q.get('quant_algo')!r} is not supported "
                                  f"(supported: {', '.join(_MODELOPT_ALGOS)})")
        group = q.get("group_size")
        if group is not None and int(group) != NVFP4_GROUP:
            raise CheckpointError(f"ModelOpt group_size {group}: NVFP4 needs groups of "
                                  f"{NVFP4_GROUP}")


def attach_quantized(
    stored: dict[str, StoredTensor], hf_config: dict[str, Any]
) -> dict[str, StoredTensor | QuantizedStored]:
    """The checkpoint table with each quantized weight and its scales as one entry."""
    for name in stored:
        if name.endswith((".weight_packed", ".weight_shape", ".weight_zero_point")):
            raise CheckpointError(
                f"tensor {name!r}: compressed-tensors checkpoints are not "
                "supported (use Qwen's FP8 or a ModelOpt NVFP4 release)"
            )
    _check_quantization_config(hf_config)
    block = _block_size(hf_config)
    if block is not None and block != [FP8_BLOCK, FP8_BLOCK]:
        raise CheckpointError(
            f"quantization_config.weight_block_size {block}: only "
            f"{FP8_BLOCK}×{FP8_BLOCK} FP8 blocks are supported"
        )
    out: dict[str, StoredTensor | QuantizedStored] = {}
    for name, tensor in stored.items():
        if name.endswith(_COMPANIONS) or name.endswith(_IGNORED):
            base = name.rsplit(".", 1)[0] + ".weight"
            if base not in stored and not name.endswith(_IGNORED):
                raise CheckpointError(f"tensor {name!r} scales a weight {base!r} that is absent")
            continue
        if tensor.dtype not in ("f8_e4m3", "u8"):
            out[name] = tensor
            continue
        out[name] = _quantized(name, tensor, stored)
    return out


def _quantized(name: str, codes: StoredTensor, stored: dict[str, StoredTensor]) -> QuantizedStored:
    stem = name.removesuffix(".weight")
    if codes.dtype == "u8":
        scale, scale2 = stored.get(stem + ".weight_scale"), stored.get(stem + ".weight_scale_2")
        if len(codes.shape) != 2 or scale is None or scale2 is None:
            raise CheckpointError(
                f"tensor {name!r} is U8 without the NVFP4 weight_scale and "
                "weight_scale_2 tensors (unknown packing)"
            )
        n, k = codes.shape[0], codes.shape[1] * 2
        if scale.dtype != "f8_e4m3" or scale.shape != (n, k // NVFP4_GROUP):
            raise CheckpointError(
                f"{stem}.weight_scale: NVFP4 needs e4m3 scales of shape "
                f"[{n}, {k // NVFP4_GROUP}] (groups of {NVFP4_GROUP}), got "
                f"{scale.dtype} {list(scale.shape)}"
            )
        if scale2.dtype != "f32" or int(np.prod(scale2.shape)) != 1:
            raise CheckpointError(f"{stem}.weight_scale_2: expected one f32 value")
        return QuantizedStored(name, "nvfp4", (n, k), codes, scale, scale2)
    if len(codes.shape) != 2:
        raise CheckpointError(f"tensor {name!r}: an FP8 weight must be a matrix")
    n, k = codes.shape
    blocks = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    scale = stored.get(stem + ".weight_scale_inv")
    if scale is not None:
        if scale.shape != blocks:
            raise CheckpointError(
                f"{stem}.weight_scale_inv has shape {list(scale.shape)}; "
                f"{FP8_BLOCK}×{FP8_BLOCK} blocks of [{n}, {k}] need "
                f"{list(blocks)}"
            )
        return QuantizedStored(name, "fp8", (n, k), codes, scale)
    scale = stored.get(stem + ".weight_scale")
    if scale is not None and int(np.prod(scale.shape)) == 1:
        return QuantizedStored(name, "fp8", (n, k), codes, scale)
    raise CheckpointError(
        f"tensor {name!r} is FP8 without a weight_scale_inv (128×128 blocks) "
        "or per-tensor weight_scale: loading it unscaled would be garbage"
    )
