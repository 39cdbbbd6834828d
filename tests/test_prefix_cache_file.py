"""The prefix cache file: a cache saved at shutdown gives hits after a restart (the logits of
a cold prefill, dense and hybrid); a foreign, damaged or truncated file is ignored with the
reason; a save that cannot complete keeps the previous file."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ninfer import _core
from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.engine import core_options
from ninfer.engine_types import EngineConfig
from ninfer.server.options import parse_args
from ninfer.tokenizer import Tokenizer
from toy_engine import VOCAB, make_engine, run_one

GREEDY = {"temperature": 0.0, "ignore_eos": True, "capture_logits": True}
HYBRID = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=128,
    intermediate_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
    linear_value_head_dim=32, vocab_size=400, mtp_num_hidden_layers=0,
)  # fmt: skip
LLAMA = dict(
    architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=400,
    rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=1024,
)  # fmt: skip


def _prompt(seed: int, n: int, vocab: int = VOCAB) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


@pytest.fixture(scope="module", params=["llama", "hybrid"])
def artifact(request, tmp_path_factory) -> Path:
    return make_random_artifact(
        LLAMA if request.param == "llama" else HYBRID,
        tmp_path_factory.mktemp("file") / f"{request.param}.ninfer",
        seed=4,
        dtype="f32",
        tokenizer="synthetic",
    )


def _engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 512, "threads": 1, "prefill_chunk": 128} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


def _logits(outcome) -> np.ndarray:
    return np.stack([e.logits for e in outcome.events if e.token_ids])


def test_a_restart_hits_what_the_previous_process_saved(artifact: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "cache.bin")
    prompt = _prompt(1, 200, 400)
    first = _engine(artifact)
    assert first.load_prefix_cache(path)["message"].startswith("no prefix cache file")
    cold = run_one(first, prompt, 8, **GREEDY)
    first.shutdown()
    saved = first.save_prefix_cache(path)
    assert saved["ok"], saved
    assert saved["blocks"] == (200 + 8 - 1) // 64
    del first

    second = _engine(artifact)
    loaded = second.load_prefix_cache(path)
    assert loaded["ok"] and loaded["blocks"] == saved["blocks"], loaded
    assert loaded["snapshots"] == saved["snapshots"]
    hit = run_one(second, prompt, 8, **GREEDY)
    stats = second.stats(check_cache=True)
    second.shutdown()
    assert hit.final.cached_tokens == 192
    assert hit.tokens == cold.tokens
    if "hybrid" in artifact.name:
        assert saved["snapshots"] >= 1
        # The snapshot at 192 came back: the hit recomputes what the first run computed after
        # its prompt-end tap, so the logits are the first run's bit for bit.
    assert np.array_equal(_logits(hit), _logits(cold))
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_foreign_damaged_and_truncated_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "toy.bin"
    engine = make_engine()
    run_one(engine, _prompt(2, 300), 4, temperature=0.0)
    engine.shutdown()
    assert engine.save_prefix_cache(str(path))["ok"]
    data = path.read_bytes()

    other = make_engine(vocab=300)  # another model identity
    report = other.load_prefix_cache(str(path))
    assert not report["ok"] and "another model" in report["message"]
    other.shutdown()

    cases = {
        "damaged": data[:200] + bytes([data[200] ^ 1]) + data[201:],
        "truncated": data[:-5],
        "not a prefix cache file": b"hello" * 20,
    }
    for word, content in cases.items():
        bad = tmp_path / f"{word}.bin"
        bad.write_bytes(content)
        fresh = make_engine()
        report = fresh.load_prefix_cache(str(bad))
        assert not report["ok"] and word in report["message"], (word, report)
        stats = fresh.stats(check_cache=True)
        assert stats["kv_pages_cached"] == 0  # nothing was restored
        assert run_one(fresh, _prompt(2, 300), 1).final.cached_tokens == 0
        fresh.shutdown()


def test_a_save_that_cannot_complete_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    engine = make_engine()
    run_one(engine, _prompt(3, 300), 4, temperature=0.0)
    engine.shutdown()
    assert engine.save_prefix_cache(str(path))["ok"]
    before = path.read_bytes()

    again = make_engine()
    assert again.load_prefix_cache(str(path))["ok"]
    run_one(again, _prompt(4, 300), 4, temperature=0.0)
    again.shutdown()
    (tmp_path / "cache.bin.tmp").mkdir()  # the temporary file cannot be written
    report = again.save_prefix_cache(str(path))
    assert not report["ok"] and "cannot write" in report["message"]
    assert path.read_bytes() == before


def test_a_small_pool_restores_a_prefix_closed_part(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    engine = make_engine(kv_capacity=4096)
    for seed in range(4):
        run_one(engine, _prompt(10 + seed, 300), 4, temperature=0.0)
    engine.shutdown()
    assert engine.save_prefix_cache(str(path))["blocks"] == 16
    small = make_engine(kv_capacity=640)  # 10 pages
    report = small.load_prefix_cache(str(path))
    assert report["ok"] and report["blocks"] == 10 and "smaller" in report["message"]
    assert small.stats(check_cache=True)["cache_problem"] == ""
    out = run_one(small, _prompt(20, 300), 4, temperature=0.0)  # evicts restored blocks
    assert out.final.finish_reason == "length"
    stats = small.stats(check_cache=True)
    assert stats["cache_problem"] == "" and stats["kv_pages_free"] == stats["kv_pages_total"]
    small.shutdown()


def test_cli_checks_the_cache_file_option(tmp_path: Path) -> None:
    args = parse_args(["--prefix-cache-file", str(tmp_path / "c.bin")])
    assert args.prefix_cache_file == str(tmp_path / "c.bin")
    with pytest.raises(SystemExit):
        parse_args(["--prefix-cache-file", str(tmp_path / "missing" / "c.bin")])
    with pytest.raises(SystemExit):
        parse_args(["--prefix-cache-file", str(tmp_path / "c.bin"), "--no-prefix-reuse"])


def test_async_engine_restores_at_open_and_saves_at_close(artifact: Path, tmp_path: Path) -> None:
    import asyncio

    from ninfer.engine import AsyncEngine
    from ninfer.engine_types import GenerationRequest, SamplingParams

    path = str(tmp_path / "cache.bin")
    config = EngineConfig(max_context=512, threads=1, prefix_cache_file=path)
    prompt = _prompt(7, 150, 400)

    async def turn() -> tuple[int, list[int]]:
        engine = AsyncEngine.open(artifact, config)
        request = GenerationRequest(prompt, 6, SamplingParams(temperature=0.0), ignore_eos=True)
        events = [event async for event in engine.submit(request)]
        await engine.close()
        return events[-1].cached_tokens, [t for e in events for t in e.token_ids]

    cached_first, tokens_first = asyncio.run(turn())
    assert Path(path).exists() and not Path(path + ".tmp").exists()
    cached_again, tokens_again = asyncio.run(turn())
    assert (cached_first, cached_again) == (0, 128)
    assert tokens_again == tokens_first


def test_cli_memory_and_cache_options(capsys) -> None:
    from ninfer.server.cli import engine_config

    config = engine_config(parse_args([]))
    assert (config.kv_capacity, config.vram_headroom_mib, config.prefix_reuse) == (0, 1024, True)
    config = engine_config(parse_args(["--kv-capacity", "auto", "--vram-headroom-mib", "512"]))
    assert (config.kv_capacity, config.vram_headroom_mib) == (0, 512)
    config = engine_config(parse_args(["--kv-capacity", "100000", "--device-snapshot-slots", "9"]))
    assert (config.kv_capacity, config.snapshot_slots) == (100000, 9)
    # Without reuse nothing is retained: the pool follows lanes x --max-context.
    config = engine_config(
        parse_args(["--no-prefix-reuse", "--max-concurrency", "3", "--max-context", "4096"])
    )
    assert (config.kv_capacity, config.prefix_reuse) == (3 * 4096, False)
    config = engine_config(
        parse_args(["--cache-taps-per-request", "0", "--cache-tap-ladder", "2048"])
    )
    assert (config.taps_per_request, config.tap_ladder, config.tap_min_gap) == (0, 2048, 0)
    refused = {
        ("--kv-capacity", "12"): "at least 64",
        ("--kv-capacity", "lots"): "auto",
        ("--kv-capacity", "4096", "--vram-headroom-mib", "1"): "requires --kv-capacity auto",
        ("--no-prefix-reuse", "--cache-tap-min-gap", "64"): "--no-prefix-reuse",
        ("--use-original-prefix-caching",): "hybrid prefix cache",
        ("--device-state-slots", "4"): "original prefix cache",
        ("--host-context-mib", "-1"): "positive number of MiB",
        ("--host-context-mib", "lots"): "number of MiB",
        ("--host-context-mib", "0.0000001"): "whole number of bytes",
        ("--host-context-mib", "0", "--prefix-cache-file", "x.cache"): "needs a host tier",
        ("--device-snapshot-slots", "65"): "out of range",
    }
    for argv, words in refused.items():
        with pytest.raises(SystemExit):
            parse_args(list(argv))
        assert words in capsys.readouterr().err, argv
    assert parse_args(["--host-context-mib", "0"]).host_context_bytes == 0
    assert parse_args(["--host-context-mib", "0.5"]).host_context_bytes == 1 << 19
    # The spec's default, and none without prefix reuse (nothing is retained).
    assert engine_config(parse_args([])).host_context_bytes == 8192 << 20
    assert engine_config(parse_args(["--no-prefix-reuse"])).host_context_bytes == 0
