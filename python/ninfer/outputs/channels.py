"""The output decoder: committed output -> reasoning, content and tool-call channels.

One decoder per generated turn; protocol adapters (Chat Completions, Responses, Anthropic
Messages) all read the same channels and only differ in how they frame them.

API
---
    config = DecoderConfig(
        thinking=ThinkingStart.OPEN,        # prompt ended with `<think>\\n`; CLOSED: thinking
                                            # off; MODEL: a leading `<think>` opens it;
                                            # ThinkingStart.after_prompt(prompt) picks OPEN/CLOSED
        tools={"get_weather": {...}},       # name -> parameters JSON schema; None = no tool
                                            # parsing (tool_choice none, or no tools)
        tolerant_tool_calls=False,          # --tolerant-tool-calls
        think_end_token_id=QWEN3_5_THINK_END_ID,  # token-exact reasoning_tokens (optional)
    )
    decoder = OutputDecoder(config)         # call_id_factory=..., logger=... for tests
    delta = decoder.feed(text, token_ids)   # -> ChannelDelta(reasoning=..., content=...)
    decoder.reasoning_complete              # no more reasoning will come (close the block)
    tail = decoder.finish(TurnEnd.STOP_TOKEN)
        # -> DecodedTail(delta=ChannelDelta, tool_calls=[ToolCall(index, id, name,
        #    arguments)], report=ToolCallParseReport | None, reasoning_tokens=int)
    decode_text(text, config, TurnEnd.STOP_TOKEN)   # whole output at once (aggregate)

`feed` takes the decoded text of each committed batch (EngineEvent.text through an
incremental UTF-8 decoder: stop strings are already withheld) and, optionally, that batch's
token ids; `TurnEnd.from_engine(event.finish_reason, event.stop_reason)` gives `finish` its
argument. Within one delta the
reasoning part precedes the content part, and reasoning never follows content: emit them in
that order. `finish` returns the terminal part of the stream: the last held text, then the
tool calls, which are only ever published complete, with stable indices 0..n-1 and unique
`call_...` ids. Concatenating every delta and the tail gives the same channels however the
output was segmented into feeds.

Channel text is normalized the way the Qwen templates re-render a replayed turn: reasoning
has no line breaks at either end, and the line breaks right after the closing `</think>` are
not content (reasoning.py). Everything else is published byte for byte.

What is held back while streaming: in reasoning, a suffix that may still be `</think>` (see
reasoning.py); in content, only a suffix that may still become `<tool_call>`, and from a
complete `<tool_call>` on, the tool region, until it resolves. A region whose prefix can no
longer parse is released as text at once (checked at geometric intervals, so the work stays
linear); otherwise it resolves at `finish`. With tolerant tool calls, reasoning from a
`<tool_call>` marker on is held the same way, because calls stranded in a thinking block the
model never closed may become the structured turn; it is released when the thinking closes.

Tool-call parsing is all or nothing (qwen_tool_calls.py): when markup is returned to text,
one warning line names the classification and the markup's first 240 bytes; a tolerant
recovery logs one Info line. `DecodedTail.report` carries the request_done.tool_call_parse
counters.

reasoning_tokens counts the tokens fed while the reasoning channel was open, the closing
`</think>` token included (all of them when the turn ended inside reasoning). Token-exact
when each feed's ids match its text and the closer is the special `</think>` token
(`think_end_token_id`): inside the feed that closes reasoning, the tokens up to that
special token count. If the marker was spelled with ordinary tokens, the whole closing feed
counts (exact for one-token feeds).
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from ninfer.outputs.qwen_tool_calls import (
    TOOL_CALL_OPEN,
    ParsedCall,
    RegionParse,
    RegionStatus,
    ToolTurn,
    ambiguous_suffix_length,
    find_tool_turn,
    parse_region,
)
from ninfer.outputs.reasoning import THINK_CLOSE, ReasoningSplitter, ThinkingStart
from ninfer.outputs.tool_arguments import ArgumentStats, ToolSchemas, build_arguments

__all__ = [
    "QWEN3_5_THINK_END_ID",
    "ChannelDelta",
    "DecodedTail",
    "DecodedText",
    "DecoderConfig",
    "OutputDecoder",
    "ThinkingStart",
    "ToolCall",
    "ToolCallParseReport",
    "TurnEnd",
    "decode_text",
    "new_call_id",
]

QWEN3_5_THINK_END_ID = 248069  # `</think>` in the Qwen3.5/3.6 vocabulary
EXCERPT_BYTES = 240

_log = logging.getLogger("ninfer.outputs")


class TurnEnd(enum.Enum):
    STOP_TOKEN = "stop_token"  # the model's stop token (eos / a stop token id)
    STOP_STRING = "stop_string"
    LENGTH = "length"  # output budget or context capacity
    CANCELLED = "cancelled"
    ERROR = "error"

    @classmethod
    def from_engine(cls, finish_reason: str | None, stop_reason: str | int | None) -> TurnEnd:
        """From a finished EngineEvent: "stop" with a token id or a stop string, "length",
        "cancelled", "error"."""
        if finish_reason == "stop":
            return cls.STOP_STRING if isinstance(stop_reason, str) else cls.STOP_TOKEN
        if finish_reason == "length":
            return cls.LENGTH
        if finish_reason == "cancelled":
            return cls.CANCELLED
        return cls.ERROR


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    thinking: ThinkingStart = ThinkingStart.CLOSED
    tools: ToolSchemas | None = None
    tolerant_tool_calls: bool = False
    think_end_token_id: int | None = None

    @classmethod
    def plain(cls) -> DecoderConfig:
        """Models without reasoning or tool markup: everything is content."""
        return cls()


@dataclass(slots=True)
class ChannelDelta:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


@dataclass(frozen=True, slots=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # JSON object text, members in the order the model wrote them


@dataclass(slots=True)
class ToolCallParseReport:
    """request_done.result.tool_call_parse; no arguments or generated text."""

    marker_seen: bool = False
    structured_call_count: int = 0
    empty_non_string_omitted: int = 0
    schema_mismatch_preserved: int = 0
    duplicate_parameters_repaired: int = 0
    fallback_reason: str = "none"
    tolerant_recovered: bool = False
    recovered_from_reasoning: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class DecodedTail:
    delta: ChannelDelta
    tool_calls: list[ToolCall]
    report: ToolCallParseReport | None  # None when tool parsing is off
    reasoning_tokens: int


@dataclass(slots=True)
class DecodedText:
    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    report: ToolCallParseReport | None
    reasoning_tokens: int


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _RegionHold:
    """Publishes text up to the first live `<tool_call>` candidate and holds from there.

    `parse_prefix` parses a held region (starting at its marker) as a prefix; a FAILED one is
    dead for every extension, so it is released up to the next marker. `on_dead` hears about
    each dead region: its offset in everything pushed, and its classification.
    """

    def __init__(
        self,
        parse_prefix: Callable[[str], RegionParse],
        on_dead: Callable[[int, str], None] | None = None,
    ) -> None:
        self._parse_prefix = parse_prefix
        self._on_dead = on_dead
        self._tail = ""  # unpublished text outside a region: an ambiguous marker prefix
        self._region: list[str] | None = None
        self._region_len = 0
        self._next_check = 0
        self.base = 0  # offset of the first unpublished character in everything pushed

    def push(self, text: str) -> str:
        if self._region is not None:
            self._region.append(text)
            self._region_len += len(text)
            return self._check() if self._region_len >= self._next_check else ""
        return self._scan(self._tail + text)

    def take(self) -> str:
        """Everything unpublished; the hold is then empty."""
        held = "".join(self._region) if self._region is not None else self._tail
        self.base += len(held)
        self._region, self._region_len, self._tail = None, 0, ""
        return held

    def _scan(self, text: str) -> str:
        marker = text.find(TOOL_CALL_OPEN)
        if marker < 0:
            keep = ambiguous_suffix_length(text, TOOL_CALL_OPEN)
            self._tail = text[len(text) - keep :]
            self.base += len(text) - keep
            return text[: len(text) - keep]
        self._tail = ""
        self._region = [text[marker:]]
        self._region_len = len(text) - marker
        self.base += marker
        return text[:marker] + self._check()

    def _check(self) -> str:
        assert self._region is not None
        region = "".join(self._region)
        parsed = self._parse_prefix(region)
        if parsed.status is not RegionStatus.FAILED:
            self._region = [region]
            self._next_check = len(region) + max(32, len(region) // 4)
            return ""
        if self._on_dead is not None:
            self._on_dead(self.base, parsed.reason)
        self._region, self._region_len = None, 0
        nxt = region.find(TOOL_CALL_OPEN, 1)
        if nxt < 0:  # no marker left: publish all but an ambiguous suffix
            keep = ambiguous_suffix_length(region, TOOL_CALL_OPEN)
            self._tail = region[len(region) - keep :]
            self.base += len(region) - keep
            return region[: len(region) - keep]
        self.base += nxt
        self._region = [region[nxt:]]
        self._region_len = len(region) - nxt
        return region[:nxt] + self._check()


class _ReasoningTokens:
    """Token ids fed while reasoning may be open, attributed once its closer is known."""

    def __init__(self, think_end_id: int | None) -> None:
        self._think_end_id = think_end_id
        self._feeds: list[tuple[int, str, Sequence[int]]] = []  # (text offset, text, ids)

    def record(self, offset: int, text: str, token_ids: Sequence[int]) -> None:
        self._feeds.append((offset, text, token_ids))

    def count(self, opened: bool, close_end: int | None) -> int:
        if not opened:
            return 0
        if close_end is None:
            return sum(len(ids) for _, _, ids in self._feeds)
        total = 0
        for offset, text, ids in self._feeds:
            if not offset <= close_end - 1 < offset + len(text):
                total += len(ids)
                continue
            return total + self._closing_feed_tokens(text[: close_end - offset], ids)
        return total

    def _closing_feed_tokens(self, through_closer: str, ids: Sequence[int]) -> int:
        if self._think_end_id is None or not through_closer.endswith(THINK_CLOSE):
            return len(ids)
        wanted = through_closer.count(THINK_CLOSE)
        seen = 0
        for position, token in enumerate(ids):
            if token == self._think_end_id:
                seen += 1
                if seen == wanted:
                    return position + 1
        return len(ids)  # the marker was spelled with ordinary tokens


def excerpt(markup: str) -> str:
    """The log form of returned markup: its first 240 UTF-8 bytes, line breaks and tabs as
    spaces, `...` when cut."""
    raw = markup.encode("utf-8")
    cut = len(raw) > EXCERPT_BYTES
    shown = raw[:EXCERPT_BYTES].decode("utf-8", errors="ignore")
    shown = shown.translate({ord("\t"): " ", ord("\n"): " ", ord("\r"): " "})
    return shown + ("..." if cut else "")


class OutputDecoder:
    """Streaming split of one turn's committed output into channels (see module doc)."""

    def __init__(
        self,
        config: DecoderConfig,
        *,
        call_id_factory: Callable[[], str] = new_call_id,
        logger: logging.Logger = _log,
    ) -> None:
        self.config = config
        self._call_id = call_id_factory
        self._log = logger
        self._splitter = ReasoningSplitter(config.thinking)
        self._tokens = _ReasoningTokens(config.think_end_token_id)
        self._fed = 0
        self._finished = False
        self._tools_on = config.tools is not None
        self._declared = frozenset(config.tools) if config.tools is not None else None
        self._reasoning_parts: list[str] = []
        self._content_parts: list[str] = []  # published content
        self._answer_parts: list[str] = []  # the whole answer text (content and markup)
        self._first_failure: tuple[int, str] | None = None
        self._content_hold: _RegionHold | None = None
        self._reasoning_hold: _RegionHold | None = None
        if self._tools_on:
            self._content_hold = _RegionHold(self._parse_answer_prefix, self._note_failure)
            if config.tolerant_tool_calls and config.thinking is not ThinkingStart.CLOSED:
                self._reasoning_hold = _RegionHold(self._parse_thinking_prefix)

    # --- public -------------------------------------------------------------------------

    @property
    def reasoning(self) -> str:
        """Reasoning published so far."""
        return "".join(self._reasoning_parts)

    @property
    def content(self) -> str:
        """Content published so far."""
        return "".join(self._content_parts)

    @property
    def reasoning_complete(self) -> bool:
        """No more reasoning can be published: it closed, or the turn has none. A stream
        adapter can close its reasoning block as soon as this turns true."""
        return not self._splitter.in_reasoning  # a tolerant hold is flushed at the close

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> ChannelDelta:
        if self._finished:
            raise RuntimeError("feed() after finish(): the turn is over")
        if self._splitter.in_reasoning:
            self._tokens.record(self._fed, text, token_ids)
        self._fed += len(text)
        reasoning, answer = self._splitter.feed(text)
        return self._route(reasoning, answer)

    def finish(self, end: TurnEnd) -> DecodedTail:
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        delta = self._route(*self._splitter.finish())
        report = ToolCallParseReport() if self._tools_on else None
        from_thinking = self._resolve_thinking_hold(delta, end)
        from_answer = self._resolve_answer_hold(delta)
        turn = from_thinking or from_answer  # both at once is impossible: thinking never closed
        if report is not None:
            self._fill_report(report, turn, from_thinking is not None)
        calls = self._build_calls(turn.region.calls if turn else [], report)
        tokens = self._tokens.count(self._splitter.opened, self._splitter.close_end)
        return DecodedTail(delta, calls, report, tokens)

    # --- routing ------------------------------------------------------------------------

    def _route(self, reasoning: str, answer: str) -> ChannelDelta:
        delta = ChannelDelta()
        if reasoning:
            if self._reasoning_hold is not None:
                reasoning = self._reasoning_hold.push(reasoning)
            self._publish_reasoning(delta, reasoning)
        if self._reasoning_hold is not None and self._splitter.closed:
            self._publish_reasoning(delta, self._reasoning_hold.take())
            self._reasoning_hold = None
        if answer:
            self._answer_parts.append(answer)
            if self._content_hold is not None:
                answer = self._content_hold.push(answer)
            self._publish_content(delta, answer)
        return delta

    def _publish_reasoning(self, delta: ChannelDelta, text: str) -> None:
        if text:
            delta.reasoning += text
            self._reasoning_parts.append(text)

    def _publish_content(self, delta: ChannelDelta, text: str) -> None:
        if text:
            delta.content += text
            self._content_parts.append(text)

    # --- tool calls ---------------------------------------------------------------------

    def _parse_answer_prefix(self, region: str) -> RegionParse:
        return parse_region(
            region,
            0,
            final=False,
            tolerant=self.config.tolerant_tool_calls,
            declared=self._declared,
        )

    def _parse_thinking_prefix(self, region: str) -> RegionParse:
        # Calls stranded in thinking are recovered only when they parse strictly.
        return parse_region(region, 0, final=False, declared=self._declared)

    def _note_failure(self, offset: int, reason: str) -> None:
        if self._first_failure is None:
            self._first_failure = (offset, reason)

    def _resolve_thinking_hold(self, delta: ChannelDelta, end: TurnEnd) -> ToolTurn | None:
        """Complete calls to declared tools, from some marker to the end of a thinking block
        the model never closed, when it ended the turn with its stop token (tolerant mode)."""
        if self._reasoning_hold is None or self._splitter.closed:
            return None
        held = self._reasoning_hold.take()
        turn = None
        if end is TurnEnd.STOP_TOKEN and not self._content_parts and self._splitter.opened:
            turn = find_tool_turn(held, declared=self._declared).turn
        self._publish_reasoning(delta, held if turn is None else held[: turn.start])
        return turn

    def _resolve_answer_hold(self, delta: ChannelDelta) -> ToolTurn | None:
        if self._content_hold is None:
            return None
        base = self._content_hold.base
        held = self._content_hold.take()
        scan = find_tool_turn(
            held, tolerant=self.config.tolerant_tool_calls, declared=self._declared
        )
        if scan.first_failure_at >= 0:
            self._note_failure(base + scan.first_failure_at, scan.first_failure)
        self._publish_content(delta, held if scan.turn is None else held[: scan.turn.start])
        return scan.turn

    def _fill_report(
        self, report: ToolCallParseReport, turn: ToolTurn | None, from_thinking: bool
    ) -> None:
        report.marker_seen = from_thinking or TOOL_CALL_OPEN in "".join(self._answer_parts)
        report.recovered_from_reasoning = from_thinking
        if turn is not None:
            region = turn.region
            report.structured_call_count = len(region.calls)
            report.tolerant_recovered = region.truncated_tail or any(
                c.repaired for c in region.calls
            )
            # Markup before a region that parses is quoted content, not a fallback.
            report.fallback_reason = "truncated_tail" if region.truncated_tail else "none"
        elif self._first_failure is not None:
            offset, reason = self._first_failure
            report.fallback_reason = reason
            markup = "".join(self._answer_parts)[offset:]
            self._log.warning("tool call returned as text (%s): %s", reason, excerpt(markup))
        if from_thinking:
            self._log.info(
                "tool calls recovered from unclosed thinking: %d structured call(s)",
                report.structured_call_count,
            )
        elif report.tolerant_recovered:
            self._log.info(
                "tool calls recovered by --tolerant-tool-calls (%s): %d structured call(s)",
                report.fallback_reason,
                report.structured_call_count,
            )

    def _build_calls(
        self, calls: list[ParsedCall], report: ToolCallParseReport | None
    ) -> list[ToolCall]:
        stats = ArgumentStats()
        tools = self.config.tools or {}
        built = [
            ToolCall(
                index,
                self._call_id(),
                call.name,
                build_arguments(call.parameters, tools.get(call.name), stats),
            )
            for index, call in enumerate(calls)
        ]
        if report is not None:
            report.empty_non_string_omitted = stats.empty_non_string_omitted
            report.schema_mismatch_preserved = stats.schema_mismatch_preserved
            report.duplicate_parameters_repaired = stats.duplicate_parameters_repaired
        return built


def decode_text(
    text: str,
    config: DecoderConfig,
    end: TurnEnd,
    token_ids: Sequence[int] = (),
    *,
    call_id_factory: Callable[[], str] = new_call_id,
) -> DecodedText:
    """Aggregate decoding of a whole turn."""
    decoder = OutputDecoder(config, call_id_factory=call_id_factory)
    decoder.feed(text, token_ids)
    tail = decoder.finish(end)
    return DecodedText(
        decoder.reasoning, decoder.content, tail.tool_calls, tail.report, tail.reasoning_tokens
    )
