"""Streaming split of committed output text into reasoning and the rest of the turn.

Generated reasoning closes only at a `</think>` followed by a line break or by the end of the
turn. A marker the model quotes while reasoning (followed by a space, punctuation, anything
else) stays reasoning text. Where the turn starts is an input: the prompt ended inside
`<think>\\n` (OPEN), thinking is off (CLOSED), or the model may open it itself with a leading
`<think>` (MODEL, Qwen3-style templates whose generation prompt stops at the assistant header).

The published channels are normalized the way the Qwen templates re-render them
(`reasoning_content.strip('\\n')`, the answer after `</think>` without its leading line breaks),
so a client that replays them reproduces the prompt: line breaks at both ends of the
reasoning and directly after the closing marker are framing, not channel text.

Held back while streaming: a suffix that may still become `</think>`, a complete `</think>`
until the next character decides it, and a trailing run of line breaks in reasoning (it is
dropped if the marker follows). Everything else is published as soon as it is fed.
"""

from __future__ import annotations

import enum

from ninfer.outputs.qwen_tool_calls import ambiguous_suffix_length, is_proper_prefix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_LINE_BREAKS = "\r\n"


class ThinkingStart(enum.Enum):
    OPEN = "open"  # the prompt ended with the reasoning opener: output starts as reasoning
    CLOSED = "closed"  # no reasoning channel this turn (thinking off, or a model without it)
    MODEL = "model"  # output that starts with `<think>` (after whitespace) opens reasoning

    @classmethod
    def after_prompt(cls, prompt_text: str) -> ThinkingStart:
        """OPEN when the rendered prompt ends inside an opened reasoning block (`<think>\n`),
        CLOSED otherwise (an empty `<think>\n\n</think>\n\n` block included)."""
        return cls.OPEN if prompt_text.rstrip().endswith(THINK_OPEN) else cls.CLOSED


class _Stage(enum.Enum):
    DETECT = "detect"
    REASONING = "reasoning"
    ANSWER = "answer"


class ReasoningSplitter:
    """Feed text, get (reasoning, answer) deltas. The answer part is everything after the
    reasoning: content and tool-call markup alike, for the next stage to split."""

    def __init__(self, start: ThinkingStart) -> None:
        self._stage = {
            ThinkingStart.OPEN: _Stage.REASONING,
            ThinkingStart.CLOSED: _Stage.ANSWER,
            ThinkingStart.MODEL: _Stage.DETECT,
        }[start]
        self.opened = start is ThinkingStart.OPEN  # the reasoning channel existed this turn
        self._held = ""  # unpublished text in DETECT/REASONING
        self._held_at = 0  # offset of `_held` in everything fed so far
        self._fed = 0
        self._strip_reasoning_start = True
        self._strip_answer_start = False
        # Offset just past the `</think>` that closed reasoning, in the text fed; None if open.
        self.close_end: int | None = None

    @property
    def closed(self) -> bool:
        return self.close_end is not None

    @property
    def in_reasoning(self) -> bool:
        """Whether text fed now may still be reasoning (not yet decided otherwise)."""
        return self._stage is not _Stage.ANSWER

    def feed(self, text: str) -> tuple[str, str]:
        self._fed += len(text)
        if self._stage is _Stage.ANSWER:
            return "", self._answer(text)
        self._held += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """The end of the turn: a pending `</think>` closes, everything held is published."""
        if self._stage is _Stage.ANSWER:
            return "", ""
        return self._advance(final=True)

    # --- stages -------------------------------------------------------------------------

    def _answer(self, text: str) -> str:
        if self._strip_answer_start:
            text = text.lstrip(_LINE_BREAKS)
            self._strip_answer_start = not text
        return text

    def _reasoning(self, text: str) -> str:
        if self._strip_reasoning_start:
            text = text.lstrip(_LINE_BREAKS)
            self._strip_reasoning_start = not text
        return text

    def _advance(self, final: bool) -> tuple[str, str]:
        if self._stage is _Stage.DETECT and not self._detect(final):
            return "", ""
        if self._stage is _Stage.ANSWER:  # DETECT found no opener
            held, self._held = self._held, ""
            return "", self._answer(held)
        return self._split_reasoning(final)

    def _detect(self, final: bool) -> bool:
        """Decides whether the model opened reasoning; False while still undecided."""
        body = self._held.lstrip()
        if body.startswith(THINK_OPEN):
            consumed = len(self._held) - len(body) + len(THINK_OPEN)
            self._held = self._held[consumed:]
            self._held_at += consumed
            self._stage = _Stage.REASONING
            self.opened = True
            return True
        if not final and (not body or is_proper_prefix(body, THINK_OPEN)):
            return False
        self._stage = _Stage.ANSWER
        return True

    def _split_reasoning(self, final: bool) -> tuple[str, str]:
        held = self._held
        scan = 0
        while True:
            marker = held.find(THINK_CLOSE, scan)
            if marker < 0:
                keep = 0 if final else ambiguous_suffix_length(held, THINK_CLOSE)
                return self._publish_reasoning(held, len(held) - keep), ""
            after = marker + len(THINK_CLOSE)
            if after == len(held) and not final:
                return self._publish_reasoning(held, marker), ""  # the next char decides
            if after == len(held) or held[after] in _LINE_BREAKS:
                reasoning = self._reasoning(held[:marker].rstrip(_LINE_BREAKS))
                self.close_end = self._held_at + after
                self._stage = _Stage.ANSWER
                self._strip_answer_start = True
                self._held = ""
                return reasoning, self._answer(held[after:])
            scan = after  # a quoted marker: reasoning text

    def _publish_reasoning(self, held: str, upto: int) -> str:
        """Publishes `held[:upto]` but a trailing run of line breaks, which stays held."""
        publish = held[:upto].rstrip(_LINE_BREAKS)
        self._held = held[len(publish) :]
        self._held_at += len(publish)
        return self._reasoning(publish)
