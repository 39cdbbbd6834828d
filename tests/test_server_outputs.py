"""Incremental decoding of committed bytes into text."""

from __future__ import annotations

import random

from ninfer.outputs import IncrementalTextDecoder


def random_text(rng: random.Random, n: int) -> str:
    pools = ["abc xyz", "éüßñ", "日本語中文", "🎉🚀👍", "\u0301\u200d"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def test_any_split_of_valid_utf8_reassembles_exactly():
    rng = random.Random(1234)
    for _ in range(200):
        text = random_text(rng, rng.randint(0, 40))
        data = text.encode()
        cuts = sorted(rng.sample(range(len(data) + 1), k=min(len(data) + 1, rng.randint(0, 8))))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        decoder = IncrementalTextDecoder()
        out = [decoder.feed(p) for p in pieces]
        assert "".join(out) + decoder.flush() == text
        assert all("\ufffd" not in piece for piece in out)


def test_partial_character_is_held_until_complete():
    decoder = IncrementalTextDecoder()
    euro = "€".encode()
    assert decoder.feed(b"a" + euro[:1]) == "a"
    assert decoder.feed(euro[1:2]) == ""
    assert decoder.feed(euro[2:]) == "€"


def test_invalid_and_truncated_bytes_become_replacement_characters():
    decoder = IncrementalTextDecoder()
    assert decoder.feed(b"ok\xff!") == "ok\ufffd!"
    assert decoder.feed("日".encode()[:2]) == ""
    assert decoder.flush() == "\ufffd"
