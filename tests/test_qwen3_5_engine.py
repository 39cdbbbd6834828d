"""The engine over Qwen3.5/3.6 hybrid artifacts: batched hybrid decode with chunked prefill
equals each request alone, and lanes' recurrent state slots are reset between requests (after
a cancelled or a finished request, a request gives what it gives on a fresh engine)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from ninfer import _core  # noqa: E402
from ninfer.artifact import read_header  # noqa: E402
from ninfer.engine import core_options  # noqa: E402
from ninfer.engine_types import EngineConfig  # noqa: E402
from ninfer.tokenizer import Tokenizer  # noqa: E402
from qwen3_5_cases import VOCAB, build_artifact  # noqa: E402
from toy_engine import collect, run_one, submit_ok, wait_events  # noqa: E402

GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_5_moe"])
def artifact(request, tmp_path_factory) -> Path:
    return build_artifact(request.param, tmp_path_factory.mktemp(request.param), seed=5)[1]


def _engine(artifact: Path, **config) -> object:
    cfg = EngineConfig(**({"max_context": 512, "threads": 1} | config))
    table = Tokenizer(read_header(artifact).resource("tokenizer.json")).token_bytes()
    return _core.Engine.open(str(artifact), core_options(cfg, []), table, threads=cfg.threads)


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def test_concurrent_requests_with_chunked_prefill_match_each_alone(artifact: Path) -> None:
    requests = [(_prompt(i, n), 10) for i, n in enumerate((3, 70, 140, 33, 65, 1))]
    alone_engine = _engine(artifact, max_concurrency=1, prefill_chunk=512)
    alone = [run_one(alone_engine, p, n, **GREEDY).tokens for p, n in requests]
    alone_engine.shutdown()

    engine = _engine(artifact, max_concurrency=4, prefill_chunk=32)
    ids = [submit_ok(engine, p, n, **GREEDY) for p, n in requests]
    got = collect(engine, ids, timeout=60)
    stats = engine.stats()
    engine.shutdown()
    assert [o.final.finish_reason for o in got.values()] == ["length"] * len(requests)
    assert [got[i].tokens for i in ids] == alone
    assert len({tuple(t) for t in alone}) > 3  # the prompts lead apart
    assert stats["decode_rows"] > stats["steps"]  # rows really were batched
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


def test_request_after_cancelled_one_matches_fresh_engine(artifact: Path) -> None:
    probe = _prompt(99, 90)
    fresh = _engine(artifact, max_concurrency=1, prefill_chunk=64)
    expected = run_one(fresh, probe, 12, **GREEDY)
    fresh.shutdown()
    assert expected.final.finish_reason == "length"

    engine = _engine(artifact, max_concurrency=1, prefill_chunk=64)
    victim = submit_ok(engine, _prompt(7, 120), 400, **GREEDY)
    seen = 0
    while seen < 3:  # the victim's lane state is mid-sequence when it is cancelled
        seen += sum(len(e.token_ids) for e in wait_events(engine) if e.request_id == victim)
    engine.cancel(victim)
    assert collect(engine, [victim])[victim].final.finish_reason == "cancelled"
    after_cancel = run_one(engine, probe, 12, **GREEDY)
    after_finish = run_one(engine, probe, 12, **GREEDY)  # same lane after a finished request
    engine.shutdown()
    assert after_cancel.tokens == expected.tokens
    assert after_finish.tokens == expected.tokens
