"""Re-encode a GGUF file's quantized matrices as Q8_0 with the `gguf` library alone (no
llama.cpp build needed), so that NInfer and a llama.cpp server can serve the very same file.

    python bench/gguf_to_q8_0.py SOURCE.gguf TARGET.gguf

Every metadata field is copied (general.file_type becomes MOSTLY_Q8_0); F32/F16/BF16 tensors
are kept as they are; every other tensor is dequantized to f32 and quantized to Q8_0 (blocks
of 32 along the rows), as `llama-quantize ... Q8_0 --allow-requantize` does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

KEEP = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
MOSTLY_Q8_0 = 7  # llama_ftype


def _field_value(field):
    """A reader field's value in the form GGUFWriter.add_key_value takes."""
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        return field.contents(), kind, field.types[-1]
    return field.contents(), kind, None


def requantize(source: Path, target: Path) -> tuple[int, int]:
    """Write `target`; returns (tensors re-encoded, tensors kept)."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(target, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by the writer itself
        if name == "general.file_type":
            writer.add_uint32(name, MOSTLY_Q8_0)
            continue
        value, kind, sub = _field_value(field)
        writer.add_key_value(name, value, kind, sub_type=sub)
    changed = kept = 0
    for tensor in reader.tensors:
        if tensor.tensor_type in KEEP:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
            kept += 1
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if values.shape[-1] % 32:
            raise ValueError(f"{tensor.name}: rows of {values.shape[-1]} are not Q8_0 blocks")
        data = quantize(values, GGMLQuantizationType.Q8_0)
        writer.add_tensor(tensor.name, data, raw_dtype=GGMLQuantizationType.Q8_0)
        changed += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return changed, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    changed, kept = requantize(args.source, args.target)
    print(f"wrote {args.target}: {changed} tensors as Q8_0, {kept} kept", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
