"""Shared helpers for the output-decoder tests: feed one text under many segmentations."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from ninfer.outputs.channels import DecoderConfig, OutputDecoder, TurnEnd


@dataclass(frozen=True)
class Outcome:
    reasoning: str
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, arguments)
    report: tuple[tuple[str, object], ...] | None
    reasoning_tokens: int


def segmentations(text: str, *, seed: int = 0, random_count: int = 12) -> Iterator[list[str]]:
    """The whole text, every two-piece split, char by char, and random multi-splits."""
    yield [text]
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]
    yield list(text)
    rng = random.Random(seed)
    for _ in range(random_count):
        if len(text) < 2:
            break
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(2, 12))))
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def run(
    pieces: list[str],
    config: DecoderConfig,
    end: TurnEnd = TurnEnd.STOP_TOKEN,
    token_ids: list[list[int]] | None = None,
) -> Outcome:
    decoder = OutputDecoder(config)
    reasoning: list[str] = []
    content: list[str] = []
    for i, piece in enumerate(pieces):
        delta = decoder.feed(piece, token_ids[i] if token_ids else ())
        if delta.reasoning:
            assert not "".join(content), "reasoning published after content"
            reasoning.append(delta.reasoning)
        content.append(delta.content)
    tail = decoder.finish(end)
    if tail.delta.reasoning:
        assert not "".join(content), "reasoning published after content"
    reasoning.append(tail.delta.reasoning)
    content.append(tail.delta.content)
    assert [c.index for c in tail.tool_calls] == list(range(len(tail.tool_calls)))
    ids = [c.id for c in tail.tool_calls]
    assert len(set(ids)) == len(ids) and all(i.startswith("call_") and len(i) > 5 for i in ids)
    assert "".join(reasoning) == decoder.reasoning and "".join(content) == decoder.content
    report = tuple(sorted(tail.report.as_dict().items())) if tail.report else None
    return Outcome(
        "".join(reasoning),
        "".join(content),
        tuple((c.name, c.arguments) for c in tail.tool_calls),
        report,
        tail.reasoning_tokens,
    )


def decode_all_ways(
    text: str, config: DecoderConfig, end: TurnEnd = TurnEnd.STOP_TOKEN, *, seed: int = 0
) -> Outcome:
    """Decodes `text` under every segmentation and asserts they all agree; returns the result."""
    expected = run([text], config, end)
    for pieces in segmentations(text, seed=seed):
        got = run(pieces, config, end)
        assert got == expected, f"segmentation {pieces!r} differs:\n{got}\n!=\n{expected}"
    return expected
