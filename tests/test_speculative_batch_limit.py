"""--spec-max-batch (SpeculativeOptions::max_batch): no drafting while a step decodes more rows
than the limit, drafting again once the batch shrinks, and greedy output unchanged either way.
Over the weightless ToyModel with oracle proposals (always right), so every round a request
drafts in commits several tokens and every step it sits out is a one-token fallback step."""

from __future__ import annotations

import random

import pytest

from ninfer import _core
from ninfer.server.cli import parse_args
from ninfer.server.speculative_options import speculative_engine_fields
from toy_engine import collect, make_engine, run_one, submit_ok

GREEDY = {"temperature": 0.0, "ignore_eos": True}
LONG, SHORT = 40, 10


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(20)]


def _three_at_once(limit: int) -> tuple[list, dict]:
    """A long request beside two short ones, all resident from the start (three lanes)."""
    prompts = [_prompt(s) for s in (1, 2, 3)]
    lengths = [LONG, SHORT, SHORT]
    plain = [
        run_one(make_engine(), p, n, **GREEDY).tokens for p, n in zip(prompts, lengths, strict=True)
    ]
    # One prefill step takes all three prompts, so they start decoding together.
    engine = make_engine(
        max_concurrency=3, prefill_chunk=64, ngram_draft_tokens=3, spec_max_batch=limit
    )
    engine.toy_set_step_delay_us(3000)  # paces the steps so that all three are admitted together
    ids = [
        submit_ok(engine, p, n, draft_oracle=ref, **GREEDY)
        for p, n, ref in zip(prompts, lengths, plain, strict=True)
    ]
    outcomes = collect(engine, ids, timeout=60)
    got = [outcomes[i] for i in ids]
    for outcome, ref in zip(got, plain, strict=True):
        assert outcome.tokens == ref  # exact whether or not a step drafted
    return got, engine.stats()


def test_rounds_stop_above_the_batch_limit_and_resume_below_it():
    got, stats = _three_at_once(limit=2)
    long_tally, short_tallies = got[0].final.speculative, [o.final.speculative for o in got[1:]]
    # While three rows decode nobody drafts: the short requests spend (nearly) their whole
    # output in one-token steps, and so does the long one until they finish ...
    assert long_tally["fallback_steps"] >= SHORT - 2
    assert all(t["fallback_steps"] >= SHORT - 2 for t in short_tallies)
    # ... after which it drafts again and its rounds commit several tokens each.
    assert long_tally["rounds"] >= 3
    assert long_tally["accepted_tokens"] == long_tally["drafted_tokens"] > 2 * long_tally["rounds"]
    assert stats["spec_fallback_steps"] >= long_tally["fallback_steps"]


@pytest.mark.parametrize("limit", [0, 3])
def test_a_batch_at_or_under_the_limit_drafts_every_step(limit):
    got, _ = _three_at_once(limit)
    for outcome in got:
        tally = outcome.final.speculative
        # Only a last step with room for one token only decodes without proposals.
        assert tally["fallback_steps"] <= 1
        assert tally["rounds"] >= 2


def test_the_limit_is_checked():
    with pytest.raises(ValueError, match="batch limit"):
        _core.EngineOptions(ngram_draft_tokens=3, spec_max_batch=-2)
    assert _core.EngineOptions(spec_max_batch=4).spec_max_batch == 4
    assert _core.EngineOptions().spec_max_batch == -1  # auto until the engine opens an artifact


def test_the_flag_selects_the_limit(capsys):
    assert speculative_engine_fields(parse_args(["m.ninfer"]))["spec_max_batch"] == -1
    args = parse_args(["m.ninfer", "--ngram-draft-tokens", "4", "--spec-max-batch", "2"])
    assert speculative_engine_fields(args)["spec_max_batch"] == 2
    assert (
        speculative_engine_fields(parse_args(["m.ninfer", "--spec-max-batch", "auto"]))[
            "spec_max_batch"
        ]
        == -1
    )
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit):
            parse_args(["m.ninfer", "--spec-max-batch", bad])
        assert "--spec-max-batch" in capsys.readouterr().err
