"""Output constraints in the core, through the bindings: the grammar compiler and its cache,
the per-request matcher's token bitmask, the host mask application, and a toy engine whose
sampler only ever draws tokens the grammar allows (EOS only once the grammar can end)."""

from __future__ import annotations

import re
import select
import threading

import numpy as np
import pytest

_core = pytest.importorskip("ninfer._core")

# A byte-level vocabulary: every printable ASCII character, a few multi-character pieces,
# one control token (special: never text) and EOS. Ids past the table are padding rows.
PIECES = [chr(c).encode() for c in range(32, 127)] + [b'{"', b'":', b"true", b"false", b"\n"]
CONTROL = len(PIECES)
EOS = CONTROL + 1
TOKEN_BYTES = [*PIECES, b"<|control|>", b"<|eos|>"]
VOCAB = len(TOKEN_BYTES) + 9  # model rows past the tokenizer's ids


def allowed(mask: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB]
    return {int(i) for i in np.flatnonzero(bits)}


def piece(text: str) -> int:
    return TOKEN_BYTES.index(text.encode())


@pytest.fixture(scope="module")
def compiler():
    return _core.GrammarCompiler(TOKEN_BYTES, VOCAB, stop_ids=[EOS], special_ids=[CONTROL])


def test_choice_grammar_mask_and_termination(compiler):
    grammar = compiler.compile("ebnf", 'root ::= "yes" | "no"')
    matcher = _core.ConstraintMatcher(grammar, VOCAB)
    assert allowed(matcher.next_mask()) == {piece("y"), piece("n")}
    for ch in "no":
        assert matcher.accept(piece(ch))
    assert matcher.complete and not matcher.terminated
    assert allowed(matcher.next_mask()) == {EOS}  # only the end may follow
    assert matcher.accept(EOS)
    assert matcher.terminated
    stats = matcher.stats()
    assert stats["mask_positions"] == 2
    assert stats["mask_upload_bytes"] == 2 * 4 * ((VOCAB + 31) // 32)


def test_mask_never_allows_control_or_padding_ids(compiler):
    matcher = _core.ConstraintMatcher(compiler.compile("regex", "[ -~]*"), VOCAB)
    ids = allowed(matcher.next_mask())
    assert CONTROL not in ids
    assert not ids & set(range(len(TOKEN_BYTES), VOCAB))
    assert EOS in ids  # the empty string matches
    assert piece("a") in ids and piece("\n") not in ids


def test_rejected_token_and_rollback(compiler):
    matcher = _core.ConstraintMatcher(compiler.compile("regex", "ab+"), VOCAB)
    assert not matcher.accept(piece("b"))
    assert matcher.accept(piece("a"))
    assert matcher.accept(piece("b"))
    assert matcher.complete
    matcher.rollback(1)
    assert not matcher.complete
    assert allowed(matcher.next_mask()) == {piece("b")}


def test_json_schema_is_compact_and_ordered(compiler):
    schema = (
        '{"type":"object","properties":{"b":{"type":"boolean"},"a":{"type":"boolean"}},'
        '"required":["b","a"],"additionalProperties":false}'
    )
    matcher = _core.ConstraintMatcher(compiler.compile("json_schema", schema), VOCAB)
    text = '{"b":true,"a":false}'
    for ch in text:
        assert matcher.accept(piece(ch)), ch
    assert matcher.complete
    rejected = _core.ConstraintMatcher(compiler.compile("json_schema", schema), VOCAB)
    assert not all(rejected.accept(piece(ch)) for ch in '{"a"')  # declared order: b first
    spaced = _core.ConstraintMatcher(compiler.compile("json_schema", schema), VOCAB)
    assert spaced.accept(piece("{"))
    assert not spaced.accept(piece(" "))  # compact separators: no free whitespace


def test_prefix_is_consumed_before_the_first_token(compiler):
    grammar = compiler.compile("regex", "(BUG|TASK)-[0-9]{2}")
    matcher = _core.ConstraintMatcher(grammar, VOCAB, prefix="TAS")
    assert allowed(matcher.next_mask()) == {piece("K")}
    with pytest.raises(ValueError):
        _core.ConstraintMatcher(grammar, VOCAB, prefix="BUGS")


def test_start_after_token_leaves_thinking_free(compiler):
    think_end = piece("|")
    matcher = _core.ConstraintMatcher(compiler.compile("ebnf", 'root ::= "x"'), VOCAB, think_end)
    assert not matcher.active
    assert matcher.accept(piece("q"))  # unconstrained before the start token
    assert matcher.accept(think_end)
    assert matcher.active
    assert allowed(matcher.next_mask()) == {piece("x")}


def test_lead_text_precedes_the_language(compiler):
    compiler.compile("ebnf", 'root ::= "x"')
    grammar = compiler.compile("ebnf", 'root ::= "x"', "\n\n")
    assert grammar.cache == "built"  # the lead is part of the cache key
    matcher = _core.ConstraintMatcher(grammar, VOCAB)
    assert allowed(matcher.next_mask()) == {piece("\n")}
    for token in (piece("\n"), piece("\n"), piece("x"), EOS):
        assert matcher.accept(token)
    assert matcher.terminated


def test_apply_token_bitmask_masks_disallowed_and_padding():
    logits = np.arange(70, dtype=np.float32)
    mask = np.zeros(2, dtype=np.uint32)  # covers ids 0..63 only
    mask[0] = (1 << 3) | (1 << 31)
    mask[1] = 1 << 1  # id 33
    _core.apply_token_bitmask(logits, mask)
    kept = {int(i) for i in np.flatnonzero(np.isfinite(logits))}
    assert kept == {3, 31, 33}
    assert logits[3] == 3.0


def test_host_reference_sampler_honours_row_bitmasks():
    """sample_rows_host (what the device sampler must return) with grammar bitmasks."""
    logits = np.zeros((3, 70), dtype=np.float32)
    logits[:, 5] = 9.0  # the unmasked favourite
    only_40 = np.zeros(3, dtype=np.uint32)
    only_40[1] = 1 << 8
    rows = [
        {"temperature": 0.0, "bitmask": only_40.tolist()},
        {"temperature": 1.0, "uniform": 0.7, "bitmask": only_40.tolist()},
        {"temperature": 0.0},
    ]
    assert _core.sample_rows_host(logits, rows).tolist() == [40, 40, 5]
    nothing = [{"temperature": 0.0, "bitmask": [0, 0, 0]}]
    assert _core.sample_rows_host(logits[:1], nothing).tolist() == [-2]


def test_cache_hit_and_errors(compiler):
    first = compiler.compile("regex", "[0-9]{3}")
    again = compiler.compile("regex", "[0-9]{3}")
    assert first.cache == "built" and again.cache == "hit"
    assert first.kind == "regex"
    with pytest.raises(ValueError):
        compiler.compile("ebnf", "root ::= (")
    with pytest.raises(ValueError):
        compiler.compile("ebnf", "root ::= (")  # a cached failure fails the same way


def test_concurrent_compiles_of_one_grammar_single_flight(compiler):
    source = '{"type":"object","properties":{"n":{"type":"integer","minimum":3}}}'
    results = []

    def compile_one() -> None:
        results.append(compiler.compile("json_schema", source).cache)

    threads = [threading.Thread(target=compile_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("built") == 1
    assert set(results) <= {"built", "hit", "waited"}


def _toy_engine():
    options = _core.EngineOptions(max_concurrency=2, max_context=256, eos_ids=[EOS])
    return _core.Engine.toy(VOCAB, TOKEN_BYTES, options)


def _run(engine, **kwargs):
    result = engine.submit([piece("a")], 64, **kwargs)
    assert result.accepted, result.message
    events, done = [], False
    while not done:
        select.select([engine.event_fd], [], [], 5.0)
        for event in engine.drain_events():
            if event.request_id == result.request_id and event.kind == "output":
                events.append(event)
                done = done or event.finished
    return events


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_toy_engine_samples_only_what_the_grammar_allows(temperature):
    engine = _toy_engine()
    try:
        grammar = engine.compile_grammar("regex", "(BUG|TASK)-[0-9]{4}")
        events = _run(engine, temperature=temperature, seed=5, constraint=grammar)
        final = events[-1]
        text = b"".join(e.text for e in events).decode()
        assert re.fullmatch(r"(BUG|TASK)-[0-9]{4}", text), text
        assert final.finish_reason == "stop" and final.stop_reason == EOS
        assert final.constraint["terminated"] and final.constraint["complete"]
        assert final.constraint["mask_positions"] == sum(len(e.token_ids) for e in events)
        unconstrained = _run(engine, temperature=temperature, seed=5)
        assert unconstrained[-1].constraint is None
    finally:
        engine.shutdown()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_device_sampling_path_applies_the_mask(temperature):
    """The toy model samples through forward_sampled with the host reference of the device
    sampler: the bitmask travels in the SamplingBatch, as it does to the CUDA kernel."""
    host, device = _toy_engine(), _toy_engine()
    try:
        device.toy_sample_on_device(True)
        texts = []
        for engine in (host, device):
            grammar = engine.compile_grammar("regex", "(BUG|TASK)-[0-9]{4}")
            events = _run(engine, temperature=temperature, seed=9, constraint=grammar)
            assert events[-1].stop_reason == EOS
            texts.append(b"".join(e.text for e in events).decode())
        assert re.fullmatch(r"(BUG|TASK)-[0-9]{4}", texts[1]), texts
        assert texts[0] == texts[1]  # the same choice from the same draws
        dead = _run(
            device, temperature=0.0, constraint=device.compile_grammar("ebnf", 'root ::= "é"')
        )
        assert dead[-1].error.startswith("constraint_dead_end")
    finally:
        host.shutdown()
        device.shutdown()


def test_engine_refuses_ignore_eos_with_a_constraint():
    engine = _toy_engine()
    try:
        grammar = engine.compile_grammar("ebnf", 'root ::= "x"')
        result = engine.submit([piece("a")], 8, constraint=grammar, ignore_eos=True)
        assert result.status == "invalid" and "ignore_eos" in result.message
    finally:
        engine.shutdown()


def test_toy_engine_reports_a_dead_end():
    engine = _toy_engine()
    try:
        # No token of the vocabulary spells "é": the first position has no legal token.
        grammar = engine.compile_grammar("ebnf", 'root ::= "é"')
        final = _run(engine, temperature=0.0, constraint=grammar)[-1]
        assert final.finish_reason == "error"
        assert final.error.startswith("constraint_dead_end")
        assert final.constraint["mask_positions"] == 1 and not final.constraint["complete"]
    finally:
        engine.shutdown()
