"""The random Qwen3.5-shaped GGUF writer (bench/gguf_random_qwen35.py) and the llama-bench peer
table (bench/llama_peer.py): what llama.cpp's qwen35 loader reads, llama-quantize's Q4_K_M
type choices, finite blocks, and the floor arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gguf_random_qwen35 as gen  # noqa: E402
import llama_peer  # noqa: E402

Q = GGMLQuantizationType

# Keys llama.cpp's qwen35 loader requires (src/models/qwen35.cpp, llama-model.cpp).
REQUIRED_KEYS = [
    "general.architecture",
    "qwen35.vocab_size",
    "qwen35.context_length",
    "qwen35.embedding_length",
    "qwen35.block_count",
    "qwen35.feed_forward_length",
    "qwen35.attention.head_count",
    "qwen35.attention.head_count_kv",
    "qwen35.attention.key_length",
    "qwen35.attention.value_length",
    "qwen35.attention.layer_norm_rms_epsilon",
    "qwen35.rope.dimension_count",
    "qwen35.rope.dimension_sections",
    "qwen35.ssm.conv_kernel",
    "qwen35.ssm.inner_size",
    "qwen35.ssm.state_size",
    "qwen35.ssm.time_step_rank",
    "qwen35.ssm.group_count",
    "qwen35.full_attention_interval",
    "tokenizer.ggml.model",
]


@pytest.fixture(scope="module", params=["q8_0", "q4_k_m"])
def written(request, tmp_path_factory) -> tuple[str, Path, int]:
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"
    size = gen.write_gguf(path, gen.preset_shape("tiny"), request.param, "tiny", threads=3)
    return request.param, path, size


def test_metadata_is_what_the_qwen35_loader_reads(written) -> None:
    ftype, path, size = written
    reader = GGUFReader(path)
    for key in REQUIRED_KEYS:
        assert key in reader.fields, key
    assert reader.fields["general.architecture"].contents() == "qwen35"
    assert reader.fields["general.file_type"].contents() == gen.FTYPES[ftype]
    assert reader.fields["qwen35.rope.dimension_sections"].contents() == [11, 11, 10, 0]
    assert path.stat().st_size == size


def test_tensors_follow_the_plan_and_every_value_is_finite(written) -> None:
    ftype, path, _ = written
    shape = gen.preset_shape("tiny")
    plan = {name: (ne, kind) for name, ne, kind in gen.tensor_plan(shape, ftype)}
    reader = GGUFReader(path)
    assert {t.name for t in reader.tensors} == set(plan)
    for tensor in reader.tensors:
        ne, kind = plan[tensor.name]
        assert tensor.tensor_type == kind, tensor.name
        assert tuple(int(n) for n in tensor.shape) == ne, tensor.name
        values = dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if kind != Q.F32:  # block scales of a quantizer's size: small weights
            assert np.abs(values).max() < 1.0, tensor.name
    # Three delta-net layers and one full-attention layer in a 4-layer tiny model.
    assert "blk.3.attn_q.weight" in plan and "blk.0.ssm_a" in plan


def test_q4_k_m_types_follow_llama_quantize() -> None:
    shape = gen.preset_shape("qwen3.6-27b")
    types = {name: kind for name, _, kind in gen.tensor_plan(shape, "q4_k_m")}
    assert types["output.weight"] == Q.Q6_K
    assert types["token_embd.weight"] == Q.Q4_K
    assert types["blk.0.ssm_conv1d.weight"] == Q.F32
    # use_more_bits over 64 layers: the first and last 8, and every third from layer 10.
    more = {i for i in range(64) if i < 8 or i >= 56 or (i - 8) % 3 == 2}
    for i in range(64):
        v_like = f"blk.{i}.attn_v.weight" if (i + 1) % 4 == 0 else f"blk.{i}.attn_qkv.weight"
        expected = Q.Q6_K if i in more else Q.Q4_K
        assert types[v_like] == expected, v_like
        assert types[f"blk.{i}.ffn_down.weight"] == expected
        assert types[f"blk.{i}.ffn_gate.weight"] == Q.Q4_K
    assert all(kind == Q.Q8_0 or kind == Q.F32 for _, _, kind in gen.tensor_plan(shape, "q8_0"))


def test_the_27b_shape_has_the_published_size() -> None:
    shape = gen.preset_shape("qwen3.6-27b")
    params = sum(int(np.prod(ne)) for _, ne, _ in gen.tensor_plan(shape, "q8_0"))
    assert 26.5e9 < params < 27.5e9
    q8 = gen.weight_bytes_per_token(shape, "q8_0")
    q4 = gen.weight_bytes_per_token(shape, "q4_k_m")
    assert 26e9 < q8 < 28e9 and 14e9 < q4 < 18e9


def test_floor_counts_weights_kv_and_delta_net_state() -> None:
    shape = gen.preset_shape("tiny")
    record = {"n_prompt": 0, "n_gen": 128, "n_depth": 1024, "avg_ts": 50.0}
    record |= {"stddev_ts": 1.0, "samples_ts": [49.0, 51.0]}
    result = {"ftype": "q8_0", "records": [record]}
    (row,) = llama_peer.rows(result, shape, copy_bytes_per_s=4e12)
    kv = 1 * 2 * shape.kv_heads * shape.head_dim * 2 * 1024
    state = 3 * shape.linear_v_heads * shape.linear_head_dim**2 * 4 * 2
    moved = gen.weight_bytes_per_token(shape, "q8_0") + kv + state
    assert row["floor_tok_s"] == pytest.approx(4e12 / moved)
    assert row["of_floor"] == pytest.approx(50.0 / row["floor_tok_s"])
    assert row["test"] == "tg128" and row["depth"] == 1024


# qwen35moe's loader (src/models/qwen35moe.cpp of the pinned source) reads these on top.
MOE_KEYS = [
    "qwen35moe.expert_count",
    "qwen35moe.expert_used_count",
    "qwen35moe.expert_feed_forward_length",
    "qwen35moe.expert_shared_feed_forward_length",
]


@pytest.mark.parametrize("ftype", ["q8_0", "q4_k_m"])
def test_moe_shape_is_written_as_qwen35moe(tmp_path: Path, ftype: str) -> None:
    shape = gen.preset_shape("tiny-moe")
    path = tmp_path / f"tiny-moe-{ftype}.gguf"
    size = gen.write_gguf(path, shape, ftype, "tiny-moe", threads=2)
    reader = GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "qwen35moe"
    for key in [k.replace("qwen35.", "qwen35moe.") for k in REQUIRED_KEYS] + MOE_KEYS:
        if key != "qwen35moe.feed_forward_length":  # no dense FFN in this shape
            assert key in reader.fields, key
    assert reader.fields["qwen35moe.expert_count"].contents() == 8
    assert reader.fields["qwen35moe.expert_used_count"].contents() == 2
    plan = {name: (ne, kind) for name, ne, kind in gen.tensor_plan(shape, ftype)}
    assert {t.name for t in reader.tensors} == set(plan)
    for tensor in reader.tensors:
        ne, kind = plan[tensor.name]
        assert tensor.tensor_type == kind and tuple(int(n) for n in tensor.shape) == ne
        assert np.isfinite(dequantize(tensor.data, tensor.tensor_type)).all(), tensor.name
    # Every layer: router F16, three expert stacks [k, rows, experts], the gated shared expert.
    assert plan["blk.0.ffn_gate_inp.weight"] == ((512, 8), Q.F16)
    assert plan["blk.2.ffn_gate_exps.weight"][0] == (512, 256, 8)
    assert plan["blk.2.ffn_down_exps.weight"][0] == (256, 512, 8)
    assert plan["blk.1.ffn_gate_inp_shexp.weight"] == ((512,), Q.F32)
    assert "blk.0.ffn_down.weight" not in plan and "blk.3.ffn_down_shexp.weight" in plan
    assert path.stat().st_size == size


def test_moe_q4_k_m_types_and_routed_bytes() -> None:
    shape = gen.preset_shape("qwen3.6-35b-a3b")
    assert (shape.experts, shape.experts_used, shape.expert_ffn, shape.shared_ffn) == (
        256,
        8,
        512,
        512,
    )
    types = {name: kind for name, _, kind in gen.tensor_plan(shape, "q4_k_m")}
    more = {i for i in range(40) if i < 5 or i >= 35 or (i - 5) % 3 == 2}
    for i in range(40):
        expected = Q.Q6_K if i in more else Q.Q4_K
        assert types[f"blk.{i}.ffn_down_exps.weight"] == expected
        assert types[f"blk.{i}.ffn_down_shexp.weight"] == expected
        assert types[f"blk.{i}.ffn_gate_exps.weight"] == Q.Q4_K
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == Q.F16
    plan = gen.tensor_plan(shape, "q8_0")
    params = sum(int(np.prod(ne)) for _, ne, _ in plan)
    assert 34e9 < params < 36.5e9  # the published 35B
    experts = sum(gen.nbytes(ne, k) for name, ne, k in plan if "_exps." in name)
    everything = sum(gen.nbytes(ne, k) for name, ne, k in plan if name != "token_embd.weight")
    routed = gen.weight_bytes_per_token(shape, "q8_0")
    assert routed == pytest.approx(everything - experts + experts * 8 / 256, abs=1e3)
    assert 2.5e9 < routed < 4.5e9  # about 3B active parameters in Q8_0


def test_moe_matmul_params_count_the_routed_experts() -> None:
    shape = gen.preset_shape("qwen3.6-35b-a3b")
    dense_like = llama_peer.matmul_params(shape)
    assert 2.5e9 < dense_like < 4e9  # "A3B": about 3B active a token
