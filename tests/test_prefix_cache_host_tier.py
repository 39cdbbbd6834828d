"""The host tier of the prefix cache (CPU backend: a separate pool in RAM, exercised the way
the pinned host pool is on CUDA). Blocks and snapshots the device evicts are written there;
a later hit copies them back and gives the logits of a cold prefill. The tier keeps to its
budget and evicts in its documented order."""

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
from ninfer.tokenizer import Tokenizer
from test_prefix_cache_models import _logits
from toy_engine import VOCAB, make_engine, run_one

GREEDY = {"temperature": 0.0, "ignore_eos": True}
TOY_PAGE = 64 * 4 * 2  # the toy's page: 64 tokens x one float, K and V

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1024,
}


def _prompt(seed: int, n: int, vocab: int = VOCAB) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _consistent(engine) -> dict:
    stats = engine.stats(check_cache=True)
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    host = stats["host_tier"]
    assert host["used_bytes"] <= host["capacity_bytes"]
    return stats


def _fill(engine) -> tuple[list[int], ...]:
    # 10 device pages. A, B, C (129 tokens: two published blocks each) leave 6 cached pages;
    # D needs 7, so three blocks leave the device: A's two (leaf, then its parent), B's second.
    a, b, c, d = (_prompt(10 + i, n) for i, n in enumerate((129, 129, 129, 385)))
    for p in (a, b, c, d):
        run_one(engine, p, 1, **GREEDY)
    return a, b, c, d


def test_evicted_blocks_come_back_from_the_host_and_match_a_cold_run():
    engine = make_engine(kv_capacity=640, host_context_bytes=16 * TOY_PAGE)
    a, b, _, _ = _fill(engine)
    host = engine.stats()["host_tier"]
    assert (host["block_writes"], host["blocks"], host["block_evictions"]) == (3, 3, 0)
    assert host["used_bytes"] == 3 * TOY_PAGE and host["capacity_bytes"] == 16 * TOY_PAGE
    cold_engine = make_engine(prefix_reuse=False)
    cold = run_one(cold_engine, a + [7] * 30, 12, **GREEDY)
    cold_engine.shutdown()
    hit = run_one(engine, a + [7] * 30, 12, **GREEDY)
    assert hit.final.cached_tokens == 128  # both of A's blocks, read back from the host
    assert hit.tokens == cold.tokens
    stats = _consistent(engine)
    assert stats["host_tier"]["block_restores"] == 2
    assert stats["host_tier"]["restore_bytes"] == 2 * TOY_PAGE
    assert stats["host_tier"]["write_bytes"] >= 3 * TOY_PAGE
    engine.shutdown()


def test_the_host_budget_holds_and_its_leaves_go_first():
    # Two slabs: A's leaf block, then A's first block, then B's second arrive; the third
    # write evicts the tier's least recently used leaf, A's second block.
    engine = make_engine(kv_capacity=640, host_context_bytes=2 * TOY_PAGE)
    a, _, _, _ = _fill(engine)
    host = engine.stats(check_cache=True)["host_tier"]
    assert host["used_bytes"] == host["capacity_bytes"] == 2 * TOY_PAGE
    assert (host["block_writes"], host["block_evictions"], host["blocks"]) == (3, 1, 2)
    assert run_one(engine, a, 1, **GREEDY).final.cached_tokens == 64
    _consistent(engine)
    engine.shutdown()


def test_without_a_host_tier_evicted_blocks_are_gone():
    engine = make_engine(kv_capacity=640)
    a, _, _, _ = _fill(engine)
    host = engine.stats()["host_tier"]
    assert (host["capacity_bytes"], host["unbacked_node_losses"]) == (0, 3)
    assert run_one(engine, a, 1, **GREEDY).final.cached_tokens == 0
    _consistent(engine)
    engine.shutdown()


def test_the_cache_file_keeps_the_host_tier_and_restores_into_it(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    engine = make_engine(kv_capacity=640, host_context_bytes=16 * TOY_PAGE)
    a, _, _, _ = _fill(engine)
    engine.shutdown()
    # Device (9 blocks) and host (A's two, B's second) together: 12 distinct blocks.
    assert engine.save_prefix_cache(str(path))["blocks"] == 12
    # A 4-page device: the first four blocks stay there, the other eight go to the host.
    small = make_engine(kv_capacity=256, max_context=256, host_context_bytes=16 * TOY_PAGE)
    report = small.load_prefix_cache(str(path))
    assert report["ok"] and report["blocks"] == 12, report
    assert "8 blocks into the host tier" in report["message"]
    host = small.stats(check_cache=True)["host_tier"]
    assert (host["blocks"], host["used_bytes"]) == (8, 8 * TOY_PAGE)
    cold_engine = make_engine(prefix_reuse=False)
    cold = run_one(cold_engine, a + [9] * 20, 8, **GREEDY)
    cold_engine.shutdown()
    hit = run_one(small, a + [9] * 20, 8, **GREEDY)
    assert hit.final.cached_tokens == 128 and hit.tokens == cold.tokens
    assert small.stats()["host_tier"]["block_restores"] >= 1
    _consistent(small)
    small.shutdown()


def test_a_budget_below_one_block_is_refused():
    with pytest.raises(Exception, match="host-context-mib"):
        make_engine(kv_capacity=640, host_context_bytes=TOY_PAGE - 1)


# --- real (random-weight) models -----------------------------------------------------------


def _engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 512, "threads": 1, "prefill_chunk": 256} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_artifact(
        LLAMA, tmp_path_factory.mktemp("host") / "llama.ninfer", seed=11, dtype="f32"
    )


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from qwen3_5_cases import build_artifact

    return build_artifact("qwen3_5", tmp_path_factory.mktemp("host_qwen"), seed=5)[1]


def _evict_then_hit(artifact: Path, vocab: int, other_tokens: int = 400, **config) -> tuple:
    """A 150-token prompt, another (400 tokens: all but the first block of the first leave
    the 512-token device pool; 450: every block) , the first again (a host hit), and a cold
    run of it."""
    first_prompt, other = _prompt(3, 150, vocab), _prompt(4, other_tokens, vocab)
    cold_engine = _engine(artifact, prefix_reuse=False)
    cold = run_one(cold_engine, first_prompt, 6, capture_logits=True, **GREEDY)
    cold_engine.shutdown()
    engine = _engine(artifact, kv_capacity=512, host_context_bytes=64 << 20, **config)
    first = run_one(engine, first_prompt, 6, capture_logits=True, **GREEDY)
    run_one(engine, other, 6, **GREEDY)
    hit = run_one(engine, first_prompt, 6, capture_logits=True, **GREEDY)
    stats = engine.stats(check_cache=True)
    engine.shutdown()
    assert stats["cache_problem"] == ""
    assert stats["kv_pages_free"] == stats["kv_pages_total"]
    return cold, first, hit, stats


def test_dense_host_hit_gives_the_logits_of_a_cold_prefill(llama: Path) -> None:
    cold, first, hit, stats = _evict_then_hit(llama, LLAMA["vocab_size"])
    assert (first.final.cached_tokens, hit.final.cached_tokens) == (0, 128)
    assert stats["host_tier"]["block_restores"] >= 1
    assert hit.tokens == cold.tokens
    assert np.array_equal(_logits(hit), _logits(cold))  # bit-identical on CPU fp32


@pytest.mark.parametrize("other_tokens", [400, 450], ids=["partly", "whole-chain"])
def test_hybrid_host_hit_restores_blocks_and_the_state_snapshot(
    qwen: Path, other_tokens: int
) -> None:
    from qwen3_5_cases import VOCAB as QWEN_VOCAB

    cold, first, hit, stats = _evict_then_hit(qwen, QWEN_VOCAB, other_tokens)
    assert (first.final.cached_tokens, hit.final.cached_tokens) == (0, 128)
    host = stats["host_tier"]
    assert host["image_writes"] >= 1 and host["image_restores"] >= 1
    # A block without a snapshot is written only because a host path continues below it.
    assert host["block_restores"] == (1 if other_tokens == 400 else 2)
    # The hit resumes from the restored state: exactly what the first run computed after its
    # tap at 128, and the cold run's tokens.
    assert np.array_equal(_logits(hit), _logits(first))
    assert hit.tokens == first.tokens == cold.tokens
    np.testing.assert_allclose(_logits(hit), _logits(cold), atol=2e-4, rtol=0)


def test_metrics_report_the_host_tier_and_its_transfers():
    from ninfer.server.metrics import ServerMetrics

    engine = make_engine(kv_capacity=640, host_context_bytes=16 * TOY_PAGE)
    metrics = ServerMetrics(engine, {"model": "toy"})
    a, _, _, _ = _fill(engine)
    run_one(engine, a + [7] * 30, 2, **GREEDY)
    text = metrics.exposition().decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("ninfer_") and " " in line
    }
    assert values["ninfer_host_context_capacity_bytes"] == 16 * TOY_PAGE
    assert 0 < values["ninfer_host_context_used_bytes"] <= values["ninfer_host_context_peak_bytes"]
    assert values["ninfer_host_context_reserved_bytes"] == 0
    moved = 'ninfer_context_transfer_bytes_total{direction="%s",resource="main_kv"}'
    assert values[moved % "to_host"] >= 3 * TOY_PAGE
    assert values[moved % "to_device"] == 2 * TOY_PAGE
    assert values['ninfer_context_transfer_bytes_total{direction="to_host",resource="state"}'] == 0
    engine.shutdown()


def test_throughput_records_carry_the_hybrid_cache_object():
    from ninfer.server.telemetry import Telemetry
    from ninfer.server.throughput import ThroughputReporter

    class Log:
        def __init__(self) -> None:
            self.records: list[dict] = []

        def write(self, record: dict) -> None:
            self.records.append(record)

    engine = make_engine(kv_capacity=640, host_context_bytes=16 * TOY_PAGE)
    reporter = ThroughputReporter(engine, Telemetry(request_log=Log()), 5000)
    a, _, _, _ = _fill(engine)
    run_one(engine, a + [7] * 30, 2, **GREEDY)
    record = reporter.report()
    engine.shutdown()
    hybrid = record["context_cache"]["hybrid"]
    assert hybrid["host_block_writes"] >= 3 and hybrid["host_block_restores"] == 2
    assert hybrid["host_restore_bytes"] == 2 * TOY_PAGE
    assert hybrid["host_capacity_bytes"] == 16 * TOY_PAGE
    assert hybrid["tree_blocks"] >= hybrid["device_blocks"] > 0
    assert hybrid["evicted_blocks"] >= 3 and hybrid["reused_tokens"] >= 128
    assert record["scheduling"] == {"preemptions": 0, "replay_restores": 0, "replayed_tokens": 0}
