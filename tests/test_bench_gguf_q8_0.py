"""bench/gguf_to_q8_0.py: quantized matrices become Q8_0 with the same values (to Q8_0's
precision), float tensors and every metadata field are kept, the file type says Q8_0."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from gguf_to_q8_0 import requantize  # noqa: E402


def _source(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((8, 64)).astype(np.float32)
    writer = GGUFWriter(path, "llama")
    writer.add_uint32("general.file_type", 3)  # MOSTLY_Q4_1
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    q4 = quantize(weights, GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_q.weight", q4, raw_dtype=GGMLQuantizationType.Q4_1)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantize(q4, GGMLQuantizationType.Q4_1)


def test_requantize_keeps_values_metadata_and_float_tensors(tmp_path):
    source, target = tmp_path / "in.gguf", tmp_path / "out.gguf"
    expected = _source(source)
    assert requantize(source, target) == (1, 1)
    reader = GGUFReader(target)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["general.file_type"].contents() == 7  # MOSTLY_Q8_0
    assert fields["general.name"].contents() == "tiny"
    assert fields["tokenizer.ggml.tokens"].contents() == ["<s>", "a", "b"]
    assert fields["llama.attention.layer_norm_rms_epsilon"].contents() == pytest.approx(1e-5)
    tensors = {t.name: t for t in reader.tensors}
    q = tensors["blk.0.attn_q.weight"]
    assert q.tensor_type == GGMLQuantizationType.Q8_0
    values = dequantize(q.data, q.tensor_type)
    assert values.shape == expected.shape
    # Q8_0 steps are max|x| / 127 per block of 32: well under one Q4_1 step.
    assert np.max(np.abs(values - expected)) <= np.max(np.abs(expected)) / 127
    norm = tensors["blk.0.attn_norm.weight"]
    assert norm.tensor_type == GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(norm.data), np.ones(64, np.float32))
