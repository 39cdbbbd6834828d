"""--kv-dtype fp8|int8|nvfp4 on the CPU (the reference implementation).

The host codec against a float64 rebuild of each format (tests/kv_formats.py); the page sizes
the pool, the host tier and the cache file count; attention over a quantized pool against a
float64 reference on the dequantized values (tight) and against the unquantized values (the
format's error, bounds below); tiny random Llama and Qwen3.5 hybrid models run with each
format against bf16 KV (logit KL bounds below, greedy decoding sane); prefix-cache hits, also
through the host tier, equal cold prefills with the same format; speculative rollback; tensor-
parallel ranks; the cache file records the format; the server flag.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from kv_formats import KV_DTYPES, attention_reference, dequantize, quantize
from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.engine import core_options
from ninfer.engine_types import EngineConfig
from ninfer.server.cli import engine_config
from ninfer.server.options import parse_args
from ninfer.tokenizer import Tokenizer
from test_prefix_cache_file import GREEDY, HYBRID
from toy_engine import run_one

LLAMA = dict(
    architectures=["LlamaForCausalLM"], hidden_size=128, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=1024,
)  # fmt: skip

# Attention output error against unquantized K/V (q, K, V standard normal, head_dim 64, up
# to 300 keys): ||out - exact|| / ||exact|| over all rows. Measured 0.033 (fp8), 0.0078
# (int8), 0.12 (nvfp4); the bounds leave 1.5x.
ATTENTION_BOUND = {"fp8": 0.05, "int8": 0.012, "nvfp4": 0.18}
# Mean per-position KL(p_bf16 || p_format) of the next-token distributions of the tiny random
# models over a 160-token prompt and 24 decode steps (teacher-forced), in nats. Measured
# (llama, hybrid): fp8 9.9e-6, 1.7e-6; int8 5.3e-7, 9.8e-8; nvfp4 1.5e-4, 2.4e-5. The bounds
# leave about 3x over the larger.
KL_BOUND = {"fp8": 3e-5, "int8": 2e-6, "nvfp4": 5e-4}


def _rows(seed: int, n: int, hd: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, hd)).astype(np.float32)
    x[1] = 0.0  # an all-zero row: scale 0, codes 0
    x[2] *= 1e-6  # tiny values: e4m3 subnormals after scaling
    x[3, 5] = 300.0  # one outlier dominating its row's scale
    x[4] = np.float32(2.0) ** rng.integers(-12, 12, hd)  # exact powers of two (ties)
    return x


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_codec_matches_the_float64_rebuild(kv_dtype: str, hd: int) -> None:
    x = _rows(hd, 64, hd)
    codes, groups, scales, values = _core.kv_quantize(x, kv_dtype)
    want_codes, want_groups, want_scales = quantize(x, kv_dtype)
    assert np.array_equal(scales, want_scales)
    assert np.array_equal(groups, want_groups)
    assert np.array_equal(codes, want_codes)
    exact = dequantize(codes, groups, scales, kv_dtype, hd)
    np.testing.assert_allclose(values, exact, rtol=2**-23, atol=0)
    assert not values[1].any()
    # The quantization error of each format, per row, relative to its largest magnitude.
    err = np.abs(values.astype(np.float64) - x) / np.maximum(np.abs(x).max(axis=1), 1e-30)[:, None]
    bound = {"fp8": 2**-4, "int8": 0.5 / 127, "nvfp4": 1.0 / 6 + 2**-4}[kv_dtype]
    assert err.max() <= bound * (1 + 1e-4)  # + the f32 rounding of x / s


def test_page_bytes_follow_the_format() -> None:
    # The Qwen3.6-27B shape: 16 attention layers, 4 KV heads of 256.
    bf16 = _core.kv_page_bytes("bf16", 16, 4, 256, 2)
    sizes = {t: _core.kv_page_bytes(t, 16, 4, 256, 2) for t in KV_DTYPES}
    tokens_heads = 16 * 2 * 64 * 4
    assert bf16 == tokens_heads * 256 * 2
    assert sizes["fp8"] == sizes["int8"] == tokens_heads * (256 + 4)
    assert sizes["nvfp4"] == tokens_heads * (128 + 16 + 4)
    assert _core.kv_page_bytes("bf16", 16, 4, 256, 4) == 2 * bf16  # the CPU stores f32
    with pytest.raises(ValueError, match="not built yet; this build stores bf16, fp8, int8, nvfp4"):
        _core.kv_page_bytes("k8v4", 16, 4, 256, 2)
    with pytest.raises(ValueError, match="head_dim divisible by 16"):
        _core.kv_page_bytes("fp8", 1, 1, 24, 2)


def _attention_case(seed: int, hd: int, nh: int, nkv: int, spans):
    rng = np.random.default_rng([seed, hd, nh, nkv])
    free = list(rng.permutation(64).astype(np.int32))
    q_rows, keys, values, slices = [], [], [], []
    for start, count in spans:
        total = start + count
        slices.append((start, count, [int(free.pop()) for _ in range((total + 63) // 64)]))
        keys.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        values.append(rng.standard_normal((total, nkv, hd), dtype=np.float32))
        q_rows.append(rng.standard_normal((count, nh, hd), dtype=np.float32))
    return np.concatenate(q_rows), keys, values, slices


def _dequantized(x: np.ndarray, kv_dtype: str) -> np.ndarray:
    return _core.kv_quantize(x.reshape(-1, x.shape[-1]), kv_dtype)[3].reshape(x.shape)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_cpu_attention_reads_the_quantized_pool(kv_dtype: str) -> None:
    spans = [(0, 200), (100, 77), (37, 9), (0, 1), (250, 1)]  # prefill rows and decode rows
    hd, nh, nkv = 64, 8, 2
    q, keys, values, slices = _attention_case(3, hd, nh, nkv, spans)
    scale = 1.0 / math.sqrt(hd)
    out = np.full(q.shape, np.nan, np.float32)
    _core.paged_attention(q, keys, values, slices, 64, scale, out, threads=2, kv_dtype=kv_dtype)
    assert np.isfinite(out).all()
    dq_keys = [_dequantized(k, kv_dtype) for k in keys]
    dq_values = [_dequantized(v, kv_dtype) for v in values]
    on_dequantized = attention_reference(q, dq_keys, dq_values, slices, scale)
    np.testing.assert_allclose(out, on_dequantized, atol=2e-5, rtol=0)
    exact = attention_reference(q, keys, values, slices, scale)
    assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < ATTENTION_BOUND[kv_dtype]


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def artifact(request, tmp_path_factory) -> Path:
    return make_random_artifact(
        LLAMA if request.param == "llama" else HYBRID,
        tmp_path_factory.mktemp("kvq") / f"{request.param}.ninfer",
        seed=7,
        dtype="f32",
        tokenizer="synthetic",
    )


def _prompt(seed: int, n: int, vocab: int = 400) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _teacher_forced_logits(artifact: Path, kv_dtype: str, tokens: list[int], prefill: int):
    runner = _core.ModelRunner(str(artifact), threads=2, max_context=512, kv_dtype=kv_dtype)
    rows = [runner.forward(0, 0, tokens[:prefill], all_logits=True)]
    for pos in range(prefill, len(tokens)):  # decode steps read the quantized pool
        rows.append(runner.forward(0, pos, [tokens[pos]])[None])
    return np.concatenate(rows).astype(np.float64)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def test_models_with_quantized_kv_stay_close_to_bf16_kv(artifact: Path) -> None:
    tokens = _prompt(11, 184)
    base = _log_softmax(_teacher_forced_logits(artifact, "bf16", tokens, 160))
    for kv_dtype in KV_DTYPES:
        got = _log_softmax(_teacher_forced_logits(artifact, kv_dtype, tokens, 160))
        kl = float((np.exp(base) * (base - got)).sum(axis=1).mean())
        assert 0 < kl < KL_BOUND[kv_dtype], (artifact.name, kv_dtype, kl)


def _engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 512, "threads": 1, "prefill_chunk": 128} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


def _logits(outcome) -> np.ndarray:
    return np.stack([e.logits for e in outcome.events if e.token_ids])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_engine_greedy_decoding_and_prefix_hits(artifact: Path, kv_dtype: str) -> None:
    prompt = _prompt(2, 150)
    cold_engine = _engine(artifact, prefix_reuse=False, kv_dtype=kv_dtype)
    assert cold_engine.kv_dtype == kv_dtype
    cold = run_one(cold_engine, prompt, 12, **GREEDY)
    cold_engine.shutdown()
    reference_engine = _engine(artifact, prefix_reuse=False)
    reference = run_one(reference_engine, prompt, 12, **GREEDY)
    reference_engine.shutdown()
    # Greedy decoding is sane: the whole answer, and its first token is bf16 KV's (random
    # weights give flat distributions, so later tokens may part ways on near ties).
    assert len(cold.tokens) == 12 and all(0 <= t < 400 for t in cold.tokens)
    assert cold.tokens[0] == reference.tokens[0]

    engine = _engine(artifact, kv_dtype=kv_dtype)
    first = run_one(engine, prompt, 12, **GREEDY)
    hit = run_one(engine, prompt, 12, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert hit.final.cached_tokens == 128
    assert first.tokens == hit.tokens == cold.tokens
    # A hit reads the same codes a cold prefill wrote: the logits agree up to the fp32
    # rounding of a split prefill (hybrid), bit for bit on the dense model.
    if "llama" in artifact.name:
        assert np.array_equal(_logits(hit), _logits(cold))
    else:
        np.testing.assert_allclose(_logits(hit), _logits(cold), atol=2e-4, rtol=0)
    assert stats["cache_problem"] == ""
    assert stats["kv_page_bytes"] == _core.kv_page_bytes(
        kv_dtype, 2 if "llama" in artifact.name else 1, 2, 32 if "llama" in artifact.name else 64, 4
    )


def test_speculative_rollback_with_quantized_kv(artifact: Path) -> None:
    # Drafts with every fifth token wrong: each rejection leaves K/V (and on the hybrid the
    # recurrent state) past the accepted length, which must be rolled back or rewritten; the
    # answer must be plain greedy decoding's.
    greedy = {"temperature": 0.0, "ignore_eos": True}
    prompt = _prompt(4, 90)
    plain_engine = _engine(artifact, kv_dtype="nvfp4", prefix_reuse=False)
    plain = run_one(plain_engine, prompt, 24, **greedy).tokens
    plain_engine.shutdown()
    oracle = [(t + 1) % 400 if i % 5 == 3 else t for i, t in enumerate(plain)]
    spec_engine = _engine(artifact, kv_dtype="nvfp4", prefix_reuse=False, ngram_draft_tokens=3)
    spec = run_one(spec_engine, prompt, 24, draft_oracle=oracle, **greedy).tokens
    stats = spec_engine.stats()
    spec_engine.shutdown()
    assert spec == plain
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]


TP_HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
    head_dim=16, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16,
    linear_value_head_dim=8, vocab_size=512, mtp_num_hidden_layers=0,
)  # fmt: skip


def test_tensor_parallel_ranks_quantize_their_heads_alike(tmp_path: Path) -> None:
    # Scales are per KV head, so a rank holding half the heads stores the codes the whole
    # model would: two ranks give one rank's logits up to the reassociated sums.
    path = make_random_artifact(TP_HYBRID, tmp_path / "tp.ninfer", seed=5, dtype="f32",
                                tokenizer="synthetic")  # fmt: skip
    cfg = EngineConfig(max_context=256, threads=1, prefill_chunk=8, kv_dtype="fp8")
    table = Tokenizer(read_header(path).resource("tokenizer.json")).token_bytes()
    logits = []
    for ranks in (1, 2):
        engine = _core.Engine.open(str(path), core_options(cfg, []), table, threads=2,
                                   tensor_parallel_size=ranks)  # fmt: skip
        logits.append(_logits(run_one(engine, _prompt(8, 40, 512), 6, **GREEDY)))
        engine.shutdown()
    np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=1e-5 * np.abs(logits[0]).max())


@pytest.mark.parametrize("kv_dtype", ["fp8", "nvfp4"])
def test_host_tier_round_trip_of_quantized_blocks(artifact: Path, kv_dtype: str) -> None:
    # A 150-token prompt, a 400-token one that pushes its blocks out of the 512-token pool to
    # the host tier, the first again: its blocks come back as the format's bytes.
    first_prompt, other = _prompt(3, 150), _prompt(4, 400)
    cold_engine = _engine(artifact, prefix_reuse=False, kv_dtype=kv_dtype)
    cold = run_one(cold_engine, first_prompt, 6, **GREEDY)
    cold_engine.shutdown()
    engine = _engine(artifact, kv_capacity=512, host_context_bytes=64 << 20, kv_dtype=kv_dtype)
    run_one(engine, first_prompt, 6, **GREEDY)
    run_one(engine, other, 6, **GREEDY)
    hit = run_one(engine, first_prompt, 6, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert hit.final.cached_tokens == 128 and hit.tokens == cold.tokens
    assert stats["host_tier"]["block_restores"] >= 1
    assert stats["cache_problem"] == ""
    if "llama" in artifact.name:
        assert np.array_equal(_logits(hit), _logits(cold))
    else:
        np.testing.assert_allclose(_logits(hit), _logits(cold), atol=2e-4, rtol=0)


def test_the_cache_file_records_the_kv_format(artifact: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "cache.bin")
    prompt = _prompt(5, 200)
    first = _engine(artifact, kv_dtype="fp8")
    cold = run_one(first, prompt, 4, **GREEDY)
    first.shutdown()
    assert first.save_prefix_cache(path)["ok"]
    other = _engine(artifact, kv_dtype="int8")  # the same page bytes as fp8
    report = other.load_prefix_cache(path)
    other.shutdown()
    assert not report["ok"]
    assert "--kv-dtype fp8, but this server stores int8" in report["message"]
    again = _engine(artifact, kv_dtype="fp8")
    assert again.load_prefix_cache(path)["ok"]
    hit = run_one(again, prompt, 4, **GREEDY)
    again.shutdown()
    assert hit.final.cached_tokens == 192 and hit.tokens == cold.tokens


@pytest.mark.parametrize("value", ["bf16", "fp8", "int8", "nvfp4"])
def test_the_server_flag_reaches_the_engine(value: str) -> None:
    args = parse_args(["model.ninfer", "--kv-dtype", value])
    assert args.kv_dtype == value and args.no_op_options == []
    config = engine_config(args)
    assert config.kv_dtype == value
    assert core_options(config, []).kv_dtype == value


def test_the_server_flag_defaults_to_bf16() -> None:
    assert engine_config(parse_args(["model.ninfer"])).kv_dtype == "bf16"


@pytest.mark.parametrize("value", ["k8v4", "vq2", "k4v2"])
def test_unbuilt_kv_formats_are_refused_by_name(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["model.ninfer", "--kv-dtype", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--kv-dtype: {value} is not available in this build" in err
    assert "the KV formats it stores are bf16, fp8, int8, nvfp4" in err


def test_unknown_kv_formats_are_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["model.ninfer", "--kv-dtype", "fp16"])
    assert "expected one of bf16, fp8, int8, nvfp4, got 'fp16'" in capsys.readouterr().err


def test_the_served_model_reports_its_kv_format(artifact: Path) -> None:
    import asyncio

    from ninfer.engine import AsyncEngine

    async def open_and_close() -> dict:
        config = EngineConfig(max_context=512, threads=1, kv_dtype="nvfp4")
        engine = AsyncEngine.open(artifact, config)
        info = dict(engine.model_info)
        await engine.close()
        return info

    info = asyncio.run(open_and_close())
    assert info["kv_dtype"] == "nvfp4"  # /v1/models meta and server_start formats.kv read it
