"""Parser of Qwen's XML tool-call wire format (the unconstrained route).

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A *region* starts at a `<tool_call>` marker and runs to the end of the output (or of the
thinking, for calls stranded there). Strictly, a region parses only when it is nothing but
complete calls separated by whitespace: all or nothing. The first marker whose region parses
becomes the structured turn; text before it is ordinary content (`find_tool_turn`).

Parameter values are raw text; the wire format has no escape, so:
* function and tool-call markers inside a value are value bytes, and so are balanced nested
  `<parameter=...>...</parameter>` pairs;
* a `</parameter>` outside nesting closes the value only when optional whitespace and then
  another `<parameter=...>` opener, `</function>`, or the end of the text follow it; any other
  one is value text. There is no backtracking: a quoted closer that is followed by the next
  token closes the value, and the region then fails to parse;
* a nested opener still unmatched at the end of the text fails the region;
* one "\\n" after the opener and one before the closer are framing, not value.

Tolerant mode (--tolerant-tool-calls) keeps the strict result when there is one and otherwise
recovers: complete calls followed by a suffix or a malformed later call (the tail is
discarded), a final call cut at the end of the text (its complete parameters and a cut value
without an unmatched nested opener), repaired openers (`tool_call>` or `function=` with a
dropped `<`, a missing `<tool_call>` before a later call, a function name ended by a line
break instead of `>`, a `</function>` missing before `</tool_call>`), and undeclared tool
names, which stay structured for the consumer. It applies only where the strict grammar
fails, so a value that merely quotes closing tags is never cut short.

Parsing a prefix (`final=False`) answers whether the region can still succeed: FAILED on a
prefix is final for every extension, which lets streaming release dead regions early.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

_WHITESPACE = " \t\r\n\f\v"
_PARAMETER_OPENER = re.compile(r"<parameter=([^<>\r\n]+)>")
_PARAMETER_NAME_CHARS = re.compile(r"[^<>\r\n]*")
_INVALID_NAME_CHARS = re.compile(r"[\s<>=\"'`/\\]")


class RegionStatus(enum.Enum):
    COMPLETE = "complete"  # parsed (possibly recovered in tolerant mode)
    NEED_MORE = "need_more"  # a prefix that can still parse; only when final=False
    FAILED = "failed"  # cannot parse, whatever follows


@dataclass(slots=True)
class ParsedCall:
    name: str
    parameters: list[tuple[str, str]] = field(default_factory=list)  # raw values, in order
    function_closed: bool = False  # `</function>` seen
    repaired: bool = False  # tolerant repair of its opener, or an undeclared name kept


@dataclass(slots=True)
class RegionParse:
    status: RegionStatus
    calls: list[ParsedCall] = field(default_factory=list)
    reason: str = "none"  # fallback classification when FAILED, "truncated_tail" if recovered
    truncated_tail: bool = False  # tolerant: a suffix was discarded or a cut call kept


@dataclass(slots=True)
class ToolTurn:
    """Where the structured turn starts in the scanned text, and its calls."""

    start: int
    region: RegionParse


class _NeedMore(Exception):
    pass


class _Cut(Exception):
    """The text ended inside a call (final parse). `partial` is what a recovery may keep."""

    def __init__(self, partial: ParsedCall | None) -> None:
        self.partial = partial


class _Malformed(Exception):
    def __init__(self, reason: str, partial: ParsedCall | None = None) -> None:
        self.reason = reason
        self.partial = partial


class _NoOpener(Exception):
    pass


def is_proper_prefix(piece: str, marker: str) -> bool:
    return len(piece) < len(marker) and marker.startswith(piece)


def ambiguous_suffix_length(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def valid_tool_name(name: str) -> bool:
    return bool(name) and _INVALID_NAME_CHARS.search(name) is None


def _strip_framing(value: str) -> str:
    """The exact inverse of the template's `<parameter=P>\\n` + VALUE + `\\n</parameter>`
    (so a value's own "\\r" or line breaks survive a round trip)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _strip_cut_closer(value: str) -> str:
    """A value cut inside its own closing tag loses the partial tag."""
    cut = ambiguous_suffix_length(value, PARAMETER_CLOSE)
    return value[: len(value) - cut] if cut else value


class _RegionParser:
    def __init__(
        self, text: str, *, final: bool, tolerant: bool, declared: frozenset[str] | None
    ) -> None:
        self.text = text
        self.final = final
        self.tolerant = tolerant
        self.declared = declared
        # What may end a call's parameter list: `</function>`, and in tolerant mode also the
        # wrapper's `</tool_call>` when the model dropped the function closer (so neither
        # closing tag is left inside the last value).
        self._call_closers = (FUNCTION_CLOSE, TOOL_CALL_CLOSE) if tolerant else (FUNCTION_CLOSE,)

    # --- helpers ------------------------------------------------------------------------

    def _skip_ws(self, pos: int) -> int:
        text = self.text
        while pos < len(text) and text[pos] in _WHITESPACE:
            pos += 1
        return pos

    def _at_end(self, pos: int, partial: ParsedCall | None) -> None:
        if pos >= len(self.text):
            self._ended(partial)

    def _ended(self, partial: ParsedCall | None) -> None:
        if not self.final:
            raise _NeedMore
        raise _Cut(partial)

    def _partial_markup(self, pos: int, *markers: str) -> bool:
        """`text[pos:]` is a proper prefix of one of `markers` (so it reaches the end)."""
        rest = len(self.text) - pos
        return any(rest < len(m) and self.text.startswith(m[:rest], pos) for m in markers)

    def _partial_parameter_opener(self, pos: int) -> bool:
        """`text[pos:]` could still grow into a `<parameter=NAME>` opener."""
        if self._partial_markup(pos, PARAMETER_OPEN):
            return True
        if not self.text.startswith(PARAMETER_OPEN, pos):
            return False
        name = _PARAMETER_NAME_CHARS.match(self.text, pos + len(PARAMETER_OPEN))
        return name is not None and name.end() == len(self.text)

    # --- grammar ------------------------------------------------------------------------

    def parse(self, start: int) -> RegionParse:
        calls: list[ParsedCall] = []
        pos = start
        while True:
            try:
                call, pos = self._call(pos, first=not calls)
            except _NeedMore:
                return RegionParse(RegionStatus.NEED_MORE, calls)
            except _NoOpener:
                return self._failed(calls, "trailing_content", None)
            except _Cut as cut:
                return self._cut(calls, cut.partial)
            except _Malformed as bad:
                return self._failed(calls, bad.reason, bad.partial)
            calls.append(call)
            pos = self._skip_ws(pos)
            if pos == len(self.text):
                if self.final:
                    return RegionParse(RegionStatus.COMPLETE, calls)
                return RegionParse(RegionStatus.NEED_MORE, calls)

    def _failed(
        self, calls: list[ParsedCall], reason: str, partial: ParsedCall | None
    ) -> RegionParse:
        if self.tolerant:
            kept = calls + ([partial] if partial is not None and partial.function_closed else [])
            if kept:
                return RegionParse(RegionStatus.COMPLETE, kept, "truncated_tail", True)
        return RegionParse(RegionStatus.FAILED, calls, reason)

    def _cut(self, calls: list[ParsedCall], partial: ParsedCall | None) -> RegionParse:
        if not self.tolerant:
            return RegionParse(RegionStatus.FAILED, calls, "malformed_structure")
        kept = calls + ([partial] if partial is not None else [])
        if kept:
            return RegionParse(RegionStatus.COMPLETE, kept, "truncated_tail", True)
        return RegionParse(RegionStatus.FAILED, calls, "truncated_tail")

    def _call_opener(self, pos: int, first: bool) -> tuple[int, bool]:
        """Position after the call's opener, and whether it was repaired."""
        text = self.text
        if text.startswith(TOOL_CALL_OPEN, pos):
            return pos + len(TOOL_CALL_OPEN), False
        if first:
            if not self.final and self._partial_markup(pos, TOOL_CALL_OPEN):
                raise _NeedMore
            raise _NoOpener
        if self.tolerant:
            if text.startswith("tool_call>", pos):
                return pos + len("tool_call>"), True
            if text.startswith(FUNCTION_OPEN, pos) or text.startswith("function=", pos):
                return pos, True  # the wrapper keyword was dropped before a later call
        markers = (TOOL_CALL_OPEN,) + (
            ("tool_call>", FUNCTION_OPEN, "function=") if self.tolerant else ()
        )
        if not self.final and self._partial_markup(pos, *markers):
            raise _NeedMore
        raise _NoOpener

    def _function_opener(self, pos: int) -> tuple[ParsedCall, int]:
        text = self.text
        repaired = False
        if text.startswith(FUNCTION_OPEN, pos):
            pos += len(FUNCTION_OPEN)
        elif self.tolerant and text.startswith("function=", pos):
            pos += len("function=")
            repaired = True
        else:
            markers = (FUNCTION_OPEN, "function=") if self.tolerant else (FUNCTION_OPEN,)
            if self._partial_markup(pos, *markers):
                self._ended(None)
            raise _Malformed("malformed_structure")
        end = pos
        while end < len(text) and text[end] not in ">\r\n<":
            end += 1
        self._at_end(end, None)
        name = text[pos:end]
        if text[end] == ">":
            end += 1
        elif self.tolerant and text[end] in "\r\n":
            repaired = True  # the closing bracket after the name is missing
        else:
            raise _Malformed("malformed_structure")
        if self.declared is None or name not in self.declared:
            # A declared name is valid whatever it contains; others must look like a name.
            if not valid_tool_name(name):
                raise _Malformed("invalid_tool_name")
            if self.declared is not None:
                if not self.tolerant:
                    raise _Malformed("undeclared_tool")
                repaired = True
        return ParsedCall(name, repaired=repaired), end

    def _call(self, pos: int, first: bool) -> tuple[ParsedCall, int]:
        pos, repaired = self._call_opener(pos, first)
        pos = self._skip_ws(pos)
        self._at_end(pos, None)
        call, pos = self._function_opener(pos)
        call.repaired = call.repaired or repaired
        text = self.text
        while True:
            pos = self._skip_ws(pos)
            self._at_end(pos, call)
            if text.startswith(FUNCTION_CLOSE, pos):
                pos += len(FUNCTION_CLOSE)
                call.function_closed = True
                break
            if self.tolerant and text.startswith(TOOL_CALL_CLOSE, pos):
                call.repaired = True  # the model dropped `</function>` before the wrapper
                return call, pos + len(TOOL_CALL_CLOSE)
            opener = _PARAMETER_OPENER.match(text, pos)
            if opener is not None:
                pos = self._parameter(call, opener.group(1), opener.end())
                continue
            if self._partial_markup(pos, *self._call_closers) or self._partial_parameter_opener(
                pos
            ):
                self._ended(call)
            raise _Malformed("malformed_structure", call)
        pos = self._skip_ws(pos)
        self._at_end(pos, call)
        if text.startswith(TOOL_CALL_CLOSE, pos):
            return call, pos + len(TOOL_CALL_CLOSE)
        if self._partial_markup(pos, TOOL_CALL_CLOSE):
            self._ended(call)
        raise _Malformed("malformed_structure", call)

    def _parameter(self, call: ParsedCall, name: str, value_start: int) -> int:
        """Adds the parameter whose value starts at `value_start`; returns the position after
        its closer."""
        text = self.text
        depth = 0
        pos = value_start
        while True:
            lt = text.find("<", pos)
            if lt < 0:
                self._value_ended(call, name, value_start, depth)
            if text.startswith(PARAMETER_CLOSE, lt):
                after = lt + len(PARAMETER_CLOSE)
                if depth:
                    depth -= 1
                    pos = after
                    continue
                if self._closes_value(after):
                    call.parameters.append((name, _strip_framing(text[value_start:lt])))
                    return after
                pos = after
                continue
            nested = _PARAMETER_OPENER.match(text, lt)
            if nested is not None:
                depth += 1
                pos = nested.end()
                continue
            if self._partial_markup(lt, PARAMETER_CLOSE) or self._partial_parameter_opener(lt):
                self._value_ended(call, name, value_start, depth)
            pos = lt + 1

    def _closes_value(self, after: int) -> bool:
        """Whether a `</parameter>` ending at `after` (outside nesting) closes the value."""
        text = self.text
        follow = self._skip_ws(after)
        if follow == len(text):
            if self.final:
                return True  # the end of the text follows
            raise _NeedMore
        if text.startswith(self._call_closers, follow) or _PARAMETER_OPENER.match(text, follow):
            return True
        if self._partial_markup(follow, *self._call_closers) or self._partial_parameter_opener(
            follow
        ):
            if not self.final:
                raise _NeedMore
            return True  # the text ends inside the next token: a cut after this value
        return False

    def _value_ended(self, call: ParsedCall, name: str, value_start: int, depth: int) -> None:
        """The text ended inside a value: a cut call keeps it unless a nested opener is open."""
        if not self.final:
            raise _NeedMore
        if depth:
            raise _Cut(None)
        value = _strip_framing(_strip_cut_closer(self.text[value_start:]))
        call.parameters.append((name, value))
        raise _Cut(call)


def parse_region(
    text: str,
    start: int,
    *,
    final: bool,
    tolerant: bool = False,
    declared: frozenset[str] | None = None,
) -> RegionParse:
    """Parses the region of `text` that starts with the `<tool_call>` marker at `start`.

    `declared` is the set of tool names the request declared (None: any valid name).
    """
    if tolerant and final:
        # Tolerance only recovers what the strict grammar rejects: a value that quotes
        # `</parameter>` + `</tool_call>` keeps its bytes whenever the whole region parses.
        strict = _RegionParser(text, final=True, tolerant=False, declared=declared).parse(start)
        if strict.status is RegionStatus.COMPLETE:
            return strict
    return _RegionParser(text, final=final, tolerant=tolerant, declared=declared).parse(start)


@dataclass(slots=True)
class TurnScan:
    turn: ToolTurn | None  # the first region that parses, if any
    first_failure: str = "none"  # classification of the first region that did not
    first_failure_at: int = -1


def find_tool_turn(
    text: str,
    start: int = 0,
    *,
    tolerant: bool = False,
    declared: frozenset[str] | None = None,
) -> TurnScan:
    """Scans the markers of the complete `text` from `start`: the first region that parses
    (recovery included in tolerant mode) becomes the structured turn."""
    scan = TurnScan(None)
    marker = text.find(TOOL_CALL_OPEN, start)
    while marker >= 0:
        region = parse_region(text, marker, final=True, tolerant=tolerant, declared=declared)
        if region.status is RegionStatus.COMPLETE:
            scan.turn = ToolTurn(marker, region)
            return scan
        if scan.first_failure_at < 0:
            scan.first_failure, scan.first_failure_at = region.reason, marker
        marker = text.find(TOOL_CALL_OPEN, marker + 1)
    return scan
