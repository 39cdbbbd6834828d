"""The .ninfer artifact format: streaming writer, pure-Python header reader, element formats."""

from ninfer.artifact.layout import (
    ALIGNMENT,
    FORMAT_VERSION,
    MAGIC,
    ArtifactFormatError,
    align_up,
    tensor_nbytes,
)
from ninfer.artifact.numerics import (
    bf16_bits_to_f32,
    dequantize_q8_0,
    f32_to_bf16_bits,
    quantize_q8_0,
)
from ninfer.artifact.reader import ArtifactHeader, read_header
from ninfer.artifact.writer import ArtifactWriter, TensorSpec

__all__ = [
    "ALIGNMENT",
    "FORMAT_VERSION",
    "MAGIC",
    "ArtifactFormatError",
    "ArtifactHeader",
    "ArtifactWriter",
    "TensorSpec",
    "align_up",
    "bf16_bits_to_f32",
    "dequantize_q8_0",
    "f32_to_bf16_bits",
    "quantize_q8_0",
    "read_header",
    "tensor_nbytes",
]
