"""Stop strings on bytes: the StopMatcher alone (against a reference) and inside the engine."""

from __future__ import annotations

import random

from ninfer import _core
from toy_engine import ascii_token_bytes, make_engine, run_one


def _open_prefix(data: bytes, stops: list[bytes]) -> int:
    """Longest suffix of `data` that is a proper prefix of some stop."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(data)), 0, -1):
            if data.endswith(stop[:k]):
                best = max(best, k)
                break
    return best


def _first_match(data: bytes, stops: list[bytes]) -> tuple[int, int] | None:
    found = [(data.find(s), i) for i, s in enumerate(stops) if data.find(s) >= 0]
    return min(found) if found else None


def test_matcher_against_reference_on_random_chunks():
    rng = random.Random(5)
    alphabet = b"ab\xc3\xa9c"
    for _ in range(400):
        stops = [
            bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        matcher = _core.StopMatcher(stops)
        stream = b""
        released = b""
        for _ in range(30):
            chunk = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 3)))
            stream += chunk
            out, matched = matcher.push(chunk)
            released += out
            hit = _first_match(stream, stops)
            if hit is not None:
                assert matched == hit[1]
                assert released == stream[: hit[0]]
                break
            assert matched is None
            # Everything is released except exactly the suffix that could still start a stop.
            assert released == stream[: len(stream) - _open_prefix(stream, stops)]
            assert matcher.held_bytes == _open_prefix(stream, stops)
        else:
            assert released + matcher.flush() == stream


def test_match_split_across_many_pushes():
    matcher = _core.StopMatcher(["</end>"])
    pieces = [b"hello <", b"/e", b"n", b"d> tail"]
    outputs = [matcher.push(p) for p in pieces]
    assert outputs[0] == (b"hello ", None)
    assert outputs[1] == (b"", None)
    assert outputs[2] == (b"", None)
    assert outputs[3] == (b"", 0)


def test_false_start_is_released_when_it_cannot_match():
    matcher = _core.StopMatcher(["abc"])
    assert matcher.push(b"xab") == (b"x", None)
    assert matcher.push(b"d") == (b"abd", None)


def test_earliest_match_wins_then_list_order():
    assert _core.StopMatcher(["cd", "bc"]).push(b"abcd") == (b"a", 1)
    assert _core.StopMatcher(["ab", "a"]).push(b"zab") == (b"z", 0)


def test_inert_bytes_never_complete_a_match():
    matcher = _core.StopMatcher(["abc", "b"])
    assert matcher.push(b"ab", may_match=False) == (b"", None)  # "ab" may still start "abc"
    # "b" lies wholly in the inert bytes; "abc" ends in live bytes and matches.
    assert matcher.push(b"c") == (b"", 0)
    matcher = _core.StopMatcher(["abc", "b"])
    matcher.push(b"ab", may_match=False)
    assert matcher.push(b"x") == (b"abx", None)


# --- inside the engine ------------------------------------------------------------------

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def _free_run(engine, n=60):
    out = run_one(engine, PROMPT, n, temperature=0.0, ignore_eos=True)
    assert out.final.finish_reason == "length"
    return out


def test_stop_string_across_token_boundaries_is_withheld_exactly():
    table = ascii_token_bytes()
    engine = make_engine(token_bytes=table)
    free = _free_run(engine)
    # A stop that starts inside one token and ends inside a later one.
    boundaries = [0]
    for t in free.tokens:
        boundaries.append(boundaries[-1] + len(table[t]))
    start = next(b for b in boundaries[5:] if b + 1 not in boundaries) + 1
    stop = free.text[start : start + 4]
    expected_cut = free.text.find(stop)
    out = run_one(
        engine, PROMPT, 60, temperature=0.0, ignore_eos=True, stop_strings=[stop.decode()]
    )
    assert out.final.finish_reason == "stop"
    assert out.final.stop_reason == stop.decode()
    assert out.text == free.text[:expected_cut]
    # Tokens up to the one completing the match are committed (and counted).
    end = expected_cut + len(stop)
    used = next(i for i, b in enumerate(boundaries) if b >= end)
    assert out.tokens == free.tokens[:used]
    assert out.final.completion_tokens == used
    # Each event releases all but a possible stop prefix.
    released = b""
    so_far = b""
    for event in out.events[:-1]:
        so_far += b"".join(table[t] for t in event.token_ids)
        released += event.text
        assert released == so_far[: len(so_far) - _open_prefix(so_far, [stop])]
    engine.shutdown()


def test_stop_token_id_and_eos():
    free_engine = make_engine()
    free = _free_run(free_engine)
    free_engine.shutdown()
    first, fourth = free.tokens[0], free.tokens[3]

    engine = make_engine(eos_ids=[first])
    out = run_one(engine, PROMPT, 60, temperature=0.0)
    assert out.tokens == [first] and out.text == b""
    assert out.final.finish_reason == "stop" and out.final.stop_reason == first
    assert out.events[-1].stop_kind == "eos" and out.events[-1].stop_token == first

    # min_tokens masks eos until enough tokens exist: the first token is then the runner-up.
    out = run_one(engine, PROMPT, 60, temperature=0.0, min_tokens=3)
    assert out.tokens[0] != first and len(out.tokens) >= 3

    # ignore_eos keeps going to the length limit with eos in the output.
    out = run_one(engine, PROMPT, 60, temperature=0.0, ignore_eos=True)
    assert out.tokens == free.tokens and out.final.finish_reason == "length"
    engine.shutdown()

    engine = make_engine()
    out = run_one(engine, PROMPT, 60, temperature=0.0, stop_token_ids=[fourth])
    cut = free.tokens.index(fourth) + 1
    assert out.tokens == free.tokens[:cut]
    assert out.final.finish_reason == "stop" and out.final.stop_reason == fourth
    table = ascii_token_bytes()
    assert out.text == b"".join(table[t] for t in free.tokens[: cut - 1])
    engine.shutdown()


def test_min_tokens_delays_stop_strings():
    table = ascii_token_bytes()
    engine = make_engine(token_bytes=table)
    free = _free_run(engine)
    stop = table[free.tokens[0]].decode()  # completed by the very first token
    out = run_one(
        engine, PROMPT, 60, temperature=0.0, ignore_eos=True, stop_strings=[stop], min_tokens=10
    )
    # The first occurrence completed by token 11 or later is the one that stops.
    boundaries = [0]
    for t in free.tokens:
        boundaries.append(boundaries[-1] + len(table[t]))
    search_from = boundaries[10] - len(stop) + 1
    cut = free.text.find(stop.encode(), max(search_from, 0))
    if cut < 0:
        assert out.final.finish_reason == "length"
    else:
        assert out.final.finish_reason == "stop"
        assert out.text == free.text[:cut]
        assert len(out.tokens) >= 11
    engine.shutdown()
