"""--kv-dtype fp8|int8|nvfp4 on CUDA: the quantizing KV write, decode and prefill attention.

The device writes f32 K/V into a quantized pool; the pages are read back as stored and
decoded by the float64 rebuild (tests/kv_formats.py): the codes must be the host codec's, and
attention must match a float64 reference on exactly those dequantized values (poisoned
outputs: every element must be written). Decode is f32 arithmetic (tight); prefill rounds
q, the dequantized K/V and the probabilities to bf16 (the bf16 kernel's tolerance). Then a
small dense and a hybrid model decode with each format with CUDA graphs equal to eager, and
`--kv-capacity auto` gives a quantized pool more tokens. GPU machine only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kv_formats import KV_DTYPES, attention_reference, decode_region, region_layout
from ninfer import _core
from ninfer.artifact import bf16_bits_to_f32, f32_to_bf16_bits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_core.cuda_device_count() == 0, reason="no CUDA device (or no CUDA build)"),
]

from ninfer.convert.random import make_random_artifact  # noqa: E402

SPANS = [(0, 200), (100, 77), (37, 9), (513, 130)]  # prefill chunks, none page-aligned
DECODE_SPANS = [(0, 1), (63, 1), (700, 1), (2000, 1)]


@pytest.fixture(scope="module")
def ops():
    return _core.CudaOps(0)


def _case(seed: int, hd: int, nh: int, nkv: int, spans, pool_pages: int = 64):
    rng = np.random.default_rng([20261202, seed, hd, nh, nkv])
    free = list(rng.permutation(pool_pages).astype(np.int32))
    q_rows, keys, values, slices = [], [], [], []
    for start, count in spans:
        total = start + count
        slices.append((start, count, [int(free.pop()) for _ in range((total + 63) // 64)]))
        keys.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        values.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        q_rows.append(rng.standard_normal((count, nh, hd), dtype=np.float32))
    return np.concatenate(q_rows), keys, values, slices


def _stored(pages: np.ndarray, slices, keys, kv_dtype: str, nkv: int, hd: int):
    """Per slice, the stored K and V of its history decoded from the pool's pages, and the
    fraction of codes that differ from the host codec's."""
    region = region_layout(kv_dtype, nkv, hd)["bytes"]
    out_k, out_v, mismatched, total = [], [], 0, 0
    for (start, count, table), k in zip(slices, keys, strict=True):
        length = start + count
        kv = []
        for which, source in ((0, k), (1, None)):
            rows, codes = [], []
            for page in table:
                c, g, s, v = decode_region(
                    pages[page, which * region : (which + 1) * region], kv_dtype, nkv, hd
                )
                rows.append(v)
                codes.append(c.reshape(64, nkv, -1))
            kv.append(np.concatenate(rows)[:length])
            if source is not None:
                want = _core.kv_quantize(source.reshape(-1, hd), kv_dtype)[0]
                got = np.concatenate(codes)[:length].reshape(want.shape)
                mismatched += int(np.count_nonzero(got != want))
                total += got.size
        out_k.append(kv[0])
        out_v.append(kv[1])
    return out_k, out_v, mismatched / max(total, 1)


def _bf16(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(f32_to_bf16_bits(x.astype(np.float32)))


def _check(out, ref, whole_tol: float, row_tol: float) -> None:
    assert np.count_nonzero(~np.isfinite(out)) == 0, "unwritten (NaN) or non-finite elements"
    diff = out.astype(np.float64) - ref
    whole = np.linalg.norm(diff) / np.linalg.norm(ref)
    rows = np.linalg.norm(diff, axis=2) / np.maximum(np.linalg.norm(ref, axis=2), 1e-30)
    assert whole < whole_tol, f"relative error {whole:.3g}"
    assert rows.max() < row_tol, f"worst row relative error {rows.max():.3g}"


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("hd,nh,nkv", [(64, 8, 2), (128, 16, 2), (256, 24, 4)])
@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_attention_over_a_quantized_pool(ops, kv_dtype, hd, nh, nkv, path):
    spans = DECODE_SPANS if path == "decode" else SPANS
    q, keys, values, slices = _case(1, hd, nh, nkv, spans)
    scale = 1.0 / math.sqrt(hd)
    out = np.full(q.shape, np.nan, np.float32)
    pages = []
    ops.paged_attention(q, keys, values, slices, 64, scale, out, path, 0, 0,
                        kv_dtype=kv_dtype, read_pages=pages.append)  # fmt: skip
    dq_k, dq_v, mismatch = _stored(pages[0], slices, keys, kv_dtype, nkv, hd)
    assert mismatch == 0.0, f"{mismatch:.2e} of the device's K codes differ from the host codec's"
    if path == "decode":
        _check(out, attention_reference(q, dq_k, dq_v, slices, scale), 2e-5, 1e-4)
    else:
        ref = attention_reference(_bf16(q), [_bf16(k) for k in dq_k], [_bf16(v) for v in dq_v],
                                  slices, scale)  # fmt: skip
        _check(out, ref, 5e-3, 2e-2)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_split_decode_over_a_quantized_pool(ops, kv_dtype):
    q, keys, values, slices = _case(2, 128, 8, 2, [(3000, 1), (40, 1)])
    scale = 1.0 / math.sqrt(128)
    for splits in (1, 7):
        out = np.full(q.shape, np.nan, np.float32)
        pages = []
        ops.paged_attention(q, keys, values, slices, 64, scale, out, "decode", splits, 0,
                            kv_dtype=kv_dtype, read_pages=pages.append)  # fmt: skip
        dq_k, dq_v, _ = _stored(pages[0], slices, keys, kv_dtype, 2, 128)
        _check(out, attention_reference(q, dq_k, dq_v, slices, scale), 2e-5, 1e-4)


VOCAB = 400
CONFIGS = {
    "llama": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256,
        intermediate_size=384, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=4096, tie_word_embeddings=False,
    ),
    "qwen3_5": dict(
        architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
        intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=32, vocab_size=VOCAB, mtp_num_hidden_layers=0,
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def artifact(request, tmp_path_factory):
    return make_random_artifact(CONFIGS[request.param],
                                tmp_path_factory.mktemp(request.param) / "m.ninfer",
                                seed=5, tokenizer="synthetic")  # fmt: skip


def _decode(path, monkeypatch, graphs: bool, kv_dtype: str, steps: int = 40):
    monkeypatch.setenv("NINFER_CUDA_MATMUL", "gemv")
    monkeypatch.setenv("NINFER_CUDA_GRAPHS", "1" if graphs else "0")
    runner = _core.ModelRunner(str(path), max_lanes=3, max_batch_tokens=256, max_context=512,
                               device="cuda", kv_dtype=kv_dtype)  # fmt: skip
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, VOCAB, size=n).tolist() for n in (70, 5, 130)]
    for lane, ids in enumerate(prompts):
        runner.forward(lane, 0, ids)
    pos = [len(ids) for ids in prompts]
    out = []
    for i in range(steps):
        out.append(runner.forward_batch([(ln, pos[ln], [(7 * i + ln) % VOCAB]) for ln in range(3)]))
        pos = [p + 1 for p in pos]
    return np.stack(out)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_graph_decode_equals_eager_with_quantized_kv(artifact, monkeypatch, kv_dtype):
    eager = _decode(artifact, monkeypatch, False, kv_dtype)
    before = _core.cuda_graph_replays()
    graph = _decode(artifact, monkeypatch, True, kv_dtype)
    assert _core.cuda_graph_replays() - before >= 30
    assert np.all(np.isfinite(eager))
    assert np.array_equal(graph, eager), f"max |diff| {np.abs(graph - eager).max():.3e}"
    bf16 = _decode(artifact, monkeypatch, True, "bf16")
    # The same model with bf16 KV: close, not equal (the format's error).
    assert 0 < np.abs(graph - bf16).max() < 1.0


def test_auto_capacity_counts_the_smaller_pages(artifact):
    from ninfer.artifact import read_header
    from ninfer.engine import core_options
    from ninfer.engine_types import EngineConfig
    from ninfer.tokenizer import Tokenizer

    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    capacity = {}
    for kv_dtype in ("bf16", "fp8", "nvfp4"):
        cfg = EngineConfig(
            max_context=4096, device="cuda", kv_dtype=kv_dtype, vram_headroom_mib=4096
        )
        engine = _core.Engine.open(str(artifact), core_options(cfg, []), table, device="cuda")
        capacity[kv_dtype] = engine.stats()["kv_capacity_tokens"]
        engine.shutdown()
        del engine
    # head_dim 64: a bf16 row is 128 bytes, fp8 64 + 4, nvfp4 32 + 4 + 4.
    assert capacity["fp8"] / capacity["bf16"] == pytest.approx(128 / 68, rel=0.02)
    assert capacity["nvfp4"] / capacity["bf16"] == pytest.approx(128 / 40, rel=0.02)
