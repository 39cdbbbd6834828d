"""The Qwen XML tool-call parser and the schema-guided argument typing, as pure functions.

Streaming behaviour over segmentations is in test_channels.py; here the parser's prefix mode
is checked for the property streaming relies on: a prefix judged FAILED never recovers.
"""

from __future__ import annotations

import json
import random

import pytest

from ninfer.outputs.qwen_tool_calls import (
    RegionStatus,
    find_tool_turn,
    parse_region,
)
from ninfer.outputs.tool_arguments import ArgumentStats, admitted_types, build_arguments

DECLARED = frozenset({"run", "get_weather", "noargs"})


def call(name: str, *params: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    text = f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"
    return text if close else text[: -len("\n</tool_call>")]


def turn(text: str, *, tolerant: bool = False, declared=DECLARED):
    scan = find_tool_turn(text, tolerant=tolerant, declared=declared)
    if scan.turn is None:
        return None, scan.first_failure
    calls = [(c.name, c.parameters) for c in scan.turn.region.calls]
    return (text[: scan.turn.start], calls, scan.turn.region.reason), scan.first_failure


# --- structure ------------------------------------------------------------------------------


def test_single_and_multiple_calls():
    text = "Sure.\n\n" + call("get_weather", ("city", "Paris")) + "\n" + call("noargs") + "\n"
    (prefix, calls, reason), failure = turn(text)
    assert prefix == "Sure.\n\n" and reason == "none" and failure == "none"
    assert calls == [("get_weather", [("city", "Paris")]), ("noargs", [])]


def test_compact_whitespace_and_carriage_returns():
    text = "<tool_call><function=run><parameter=cmd>ls</parameter></function></tool_call>"
    assert turn(text)[0][1] == [("run", [("cmd", "ls")])]
    windows = call("run", ("cmd", "line\r\nend\r"))  # only the template's "\n" is framing
    assert turn(windows)[0][1] == [("run", [("cmd", "line\r\nend\r")])]


def test_only_one_framing_line_break_is_stripped():
    text = call("run", ("cmd", "\n  indented\n\n"))
    assert turn(text)[0][1] == [("run", [("cmd", "\n  indented\n\n")])]
    assert turn(call("run", ("cmd", "")))[0][1] == [("run", [("cmd", "")])]


@pytest.mark.parametrize(
    "value",
    [
        "<tool_call>\n<function=x>\n</function>\n</tool_call>",
        "echo '</function>' && echo </tool_call>",
        "a <parameter=inner>\nnested\n</parameter> b",
        "<parameter=a>x</parameter><parameter=b><parameter=c>y</parameter></parameter>",
        "echo '</parameter>' | cat",
        "</parameter>x",
        "</parameter>\n\nnot a parameter",
        "cat <<EOF\n</parameter >\nEOF",
        "if a < b and c <parameter or <parameter=>",
        "unicode ✓ 日本語 🚀",
    ],
)
def test_string_values_keep_markup_as_bytes(value):
    text = call("run", ("cmd", value), ("cwd", "/tmp"))
    (prefix, calls, _), _ = turn(text)
    assert prefix == "" and calls == [("run", [("cmd", value), ("cwd", "/tmp")])]


def test_closer_before_end_of_output_closes_value():
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n  "
    region = parse_region(text, 0, final=True, tolerant=True, declared=DECLARED)
    assert region.calls[0].parameters == [("cmd", "ls")] and region.truncated_tail


def test_quoted_closer_followed_by_next_token_makes_region_text():
    # the value quotes `</parameter>\n</function>`: the first closer wins, the rest is garbage
    value = "echo '</parameter>\n</function>' done"
    result, failure = turn(call("run", ("cmd", value)))
    assert result is None and failure == "malformed_structure"
    # a quoted closer before another opener reads as two parameters: the first closer wins
    value = "x</parameter>\n<parameter=y>\nz"
    (_, calls, _), _ = turn(call("run", ("cmd", value)))
    assert calls == [("run", [("cmd", "x"), ("y", "z")])]


def test_unmatched_nested_opener_makes_region_text():
    result, failure = turn(call("run", ("cmd", "echo <parameter=x> oops")))
    assert result is None and failure == "malformed_structure"


def test_later_region_is_still_examined():
    quoted = (
        "Use <tool_call> like this: <tool_call>\n<function=run>\nbad\n</function>\n</tool_call>\n"
    )
    real = call("run", ("cmd", "ls"))
    (prefix, calls, _), failure = turn(quoted + real)
    assert prefix == quoted and calls == [("run", [("cmd", "ls")])]
    assert failure == "malformed_structure"


def test_marker_inside_failed_value_can_start_the_turn():
    inner = call("run", ("cmd", "ls"))
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\n" + inner
    (prefix, calls, _), _ = turn(text)
    assert prefix == text[: text.rindex("<tool_call>")] and calls == [("run", [("cmd", "ls")])]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (call("run", ("cmd", "ls")) + "\nDone!", "trailing_content"),
        (call("run", ("cmd", "ls")) + "\n" + call("run", ("cmd", "x")) + " ok", "trailing_content"),
        (call("nope", ("a", "1")), "undeclared_tool"),
        (call("get weather", ("a", "1")), "invalid_tool_name"),
        (call("", ("a", "1")), "invalid_tool_name"),
        (call("a=b"), "invalid_tool_name"),
        (call("run", ("cmd", "ls"), close=False), "malformed_structure"),
        ("<tool_call>\n<function=run>\n<parameter=cmd>\nls", "malformed_structure"),
        ("<tool_call>\n<function=ru", "malformed_structure"),
        ("<tool_call>", "malformed_structure"),
        ("<tool_call>\nhello</tool_call>", "malformed_structure"),
        ("<tool_call>\n<function=run>\ntext\n</function>\n</tool_call>", "malformed_structure"),
        ("<tool_call>\n<function=run\n</function>\n</tool_call>", "malformed_structure"),
        ("<tool_call>\n<function=run>\n</function>\n<tool_call>", "malformed_structure"),
    ],
)
def test_strict_failures(text, reason):
    result, failure = turn(text)
    assert result is None and failure == reason


def test_declared_names_are_valid_whatever_they_contain():
    declared = frozenset({"mcp/files.read", "a=b"})
    (_, calls, _), _ = turn(call("mcp/files.read") + "\n" + call("a=b"), declared=declared)
    assert calls == [("mcp/files.read", []), ("a=b", [])]
    result, failure = turn(call("mcp/other"), declared=declared)
    assert result is None and failure == "invalid_tool_name"


def test_undeclared_names_pass_when_declared_set_is_unknown():
    (_, calls, _), _ = turn(call("anything_goes"), declared=None)
    assert calls == [("anything_goes", [])]


# --- tolerant recovery ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "calls", "reason"),
    [
        # a suffix after complete calls is discarded
        (call("run", ("cmd", "ls")) + "\nI ran it.", [("run", [("cmd", "ls")])], "truncated_tail"),
        # a malformed second call is discarded
        (
            call("run", ("cmd", "ls")) + "\n<tool_call>\n<function=run>\nbroken</tool_call>",
            [("run", [("cmd", "ls")])],
            "truncated_tail",
        ),
        # a final call cut by the output budget, at several points
        (
            call("run", ("a", "1"), ("b", "2"), close=False),
            [("run", [("a", "1"), ("b", "2")])],
            "truncated_tail",
        ),
        (
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n<param",
            [("run", [("a", "1")])],
            "truncated_tail",
        ),
        (
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</para",
            [("run", [("a", "1")])],
            "truncated_tail",
        ),
        (
            "<tool_call>\n<function=run>\n<parameter=a>\nhalf a val",
            [("run", [("a", "half a val")])],
            "truncated_tail",
        ),
        ("<tool_call>\n<function=run>\n", [("run", [])], "truncated_tail"),
        (
            call("noargs") + "\n<tool_call>\n<function=run>\n<parameter=a>\n1",
            [("noargs", []), ("run", [("a", "1")])],
            "truncated_tail",
        ),
        # repaired openers
        (
            "<tool_call>\n<function=run\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
            [("run", [("a", "1")])],
            "none",
        ),
        ("<tool_call>\nfunction=run>\n</function>\n</tool_call>", [("run", [])], "none"),
        (
            call("noargs") + "\ntool_call>\n<function=run>\n</function>\n</tool_call>",
            [("noargs", []), ("run", [])],
            "none",
        ),
        (
            call("noargs") + "\n<function=run>\n</function>\n</tool_call>",
            [("noargs", []), ("run", [])],
            "none",
        ),
        # `</function>` missing: neither closing tag leaks into the last value
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</tool_call>",
            [("get_weather", [("city", "Paris")])],
            "none",
        ),
        (
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n</tool_call>\n"
            "<tool_call>\n<function=noargs>\n</tool_call>\nDone.",
            [("run", [("a", "1")]), ("noargs", [])],
            "truncated_tail",
        ),
        (
            "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n</tool_",
            [("run", [("a", "1")])],
            "truncated_tail",
        ),
        # an undeclared tool stays structured for the consumer to judge
        (call("mystery", ("x", "1")), [("mystery", [("x", "1")])], "none"),
        # a call whose function closed but whose wrapper is followed by junk
        ("<tool_call>\n<function=run>\n</function>\nzzz", [("run", [])], "truncated_tail"),
    ],
)
def test_tolerant_recoveries(text, calls, reason):
    (prefix, got, got_reason), _ = turn(text, tolerant=True)
    assert prefix == "" and got == calls and got_reason == reason
    strict, _ = turn(text)
    assert strict is None  # each of these is text without tolerance


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=ru",  # the name may be cut
        "<tool_call>\n",
        "<tool_call>\n<function=run>\n<parameter=a>\n<parameter=b>\nx",  # unmatched nested opener
        "<tool_call>\nprose instead of a call",
        call("bad name"),
    ],
)
def test_tolerant_does_not_invent_calls(text):
    result, failure = turn(text, tolerant=True)
    assert result is None and failure in (
        "truncated_tail",
        "malformed_structure",
        "invalid_tool_name",
    )


def test_tolerant_keeps_strict_result_when_there_is_one():
    text = call("run", ("cmd", "ls")) + "\n" + call("noargs")
    assert turn(text, tolerant=True) == turn(text)
    quoting = call("run", ("cmd", "echo '</parameter>\n</tool_call>' done"))
    assert turn(quoting, tolerant=True) == turn(quoting)
    assert turn(quoting)[0][1] == [("run", [("cmd", "echo '</parameter>\n</tool_call>' done")])]


def test_tolerant_missing_function_closer_is_reported_as_a_repair():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"
    )
    region = parse_region(text, 0, final=True, tolerant=True, declared=DECLARED)
    assert region.status is RegionStatus.COMPLETE and region.calls[0].repaired
    assert region.calls[0].parameters == [("city", "Paris")]


# --- prefix mode (what streaming relies on) -------------------------------------------------

ATOMS = [
    "<tool_call>", "</tool_call>", "<function=run>", "<function=zz>", "<function=run",
    "</function>", "<parameter=a>", "<parameter=b>", "</parameter>", "\n", " ", "x", "<",
    "tool_call>", "function=run>", "<tool_", "</param", "é",
]  # fmt: skip


def random_region(rng: random.Random) -> str:
    if rng.random() < 0.5:  # mostly well formed, with a random mutation
        text = call("run", ("a", "1"), ("b", "<parameter=a>q</parameter>"))
        if rng.random() < 0.5:
            text += "\n" + call(rng.choice(["noargs", "zz"]))
        at = rng.randrange(len(text) + 1)
        return text[:at] + "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 3))) + text[at:]
    return "<tool_call>" + "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 16)))


@pytest.mark.parametrize("tolerant", [False, True])
def test_failed_prefix_never_recovers(tolerant):
    rng = random.Random(11 if tolerant else 5)
    for _ in range(250):
        text = random_region(rng)
        final = parse_region(text, 0, final=True, tolerant=tolerant, declared=DECLARED)
        failed_at = None
        for end in range(len(text) + 1):
            prefix = parse_region(text[:end], 0, final=False, tolerant=tolerant, declared=DECLARED)
            if failed_at is not None:
                assert prefix.status is RegionStatus.FAILED, (text, end, failed_at)
            elif prefix.status is RegionStatus.FAILED:
                failed_at = end
        if failed_at is not None:
            assert final.status is RegionStatus.FAILED, (text, failed_at)


def test_prefix_of_a_valid_call_is_never_failed():
    text = call("run", ("cmd", "x </parameter> <parameter=y>z</parameter>"), ("n", "2"))
    for end in range(len(text)):
        prefix = parse_region(text[:end], 0, final=False, declared=DECLARED)
        assert prefix.status is RegionStatus.NEED_MORE, text[:end]
    full = parse_region(text, 0, final=False, declared=DECLARED)
    assert full.status is RegionStatus.NEED_MORE  # more calls may still follow
    assert parse_region(text, 0, final=True, declared=DECLARED).status is RegionStatus.COMPLETE


# --- argument typing ------------------------------------------------------------------------


def typed(parameters, properties, stats=None):
    stats = stats if stats is not None else ArgumentStats()
    text = build_arguments(parameters, {"type": "object", "properties": properties}, stats)
    return json.loads(text), text


@pytest.mark.parametrize(
    ("schema", "raw", "value"),
    [
        ({"type": "string"}, "5", "5"),
        ({"type": "string"}, "", ""),
        ({"type": "string"}, "  true ", "  true "),
        ({"type": ["string", "null"]}, "null", "null"),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "7", "7"),
        ({"type": "integer"}, " 42 ", 42),
        ({"type": "integer"}, "5.0", 5.0),
        ({"type": "number"}, "-1.5e3", -1500.0),
        ({"type": "number"}, "12345678901234567890", 12345678901234567890),
        ({"type": "boolean"}, "TRUE", True),
        ({"type": "boolean"}, "False\n", False),
        ({"type": ["boolean", "null"]}, "null", None),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, "null", None),
        (
            {"oneOf": [{"type": "array"}, {"type": "object"}]},
            '{"b": 1, "a": [2]}',
            {"b": 1, "a": [2]},
        ),
        ({"type": "array"}, '[1, "two", {"3": null}]', [1, "two", {"3": None}]),
        ({"type": "object"}, '{"k": "ü"}', {"k": "ü"}),
        # untyped inference: JSON other than a string literal, else the raw text
        ({}, "5", 5),
        ({}, "[1]", [1]),
        ({}, '"quoted"', '"quoted"'),
        ({}, "plain words", "plain words"),
        ({}, "", ""),
        ({"description": "no type"}, "true", True),
        ({"$ref": "#/defs/x"}, "3", 3),
        ({"anyOf": [{"type": "integer"}, {"enum": ["a"]}]}, "x", "x"),
        ({"type": "date"}, "7", 7),
    ],
)
def test_schema_guided_types(schema, raw, value):
    got, _ = typed([("p", raw)], {"p": schema})
    assert got == {"p": value} and type(got["p"]) is type(value)


def test_untyped_when_parameter_or_tool_schema_is_missing():
    stats = ArgumentStats()
    assert json.loads(build_arguments([("p", "1"), ("q", "x")], None, stats)) == {"p": 1, "q": "x"}
    got, _ = typed([("other", "2")], {"p": {"type": "string"}})
    assert got == {"other": 2}


def test_empty_non_string_blocks_are_omitted():
    stats = ArgumentStats()
    got, _ = typed(
        [("n", ""), ("s", ""), ("b", "  \n"), ("u", "")],
        {"n": {"type": "integer"}, "s": {"type": "string"}, "b": {"type": "boolean"}},
        stats,
    )
    assert got == {"s": "", "u": ""} and stats.empty_non_string_omitted == 2


def test_schema_mismatches_stay_structured():
    stats = ArgumentStats()
    got, _ = typed(
        [("n", "abc"), ("m", "[1, 2]"), ("b", "yes"), ("f", "NaN"), ("g", "1e999"), ("o", '"s"')],
        {
            "n": {"type": "integer"},
            "m": {"type": "integer"},
            "b": {"type": "boolean"},
            "f": {"type": "number"},
            "g": {"type": "number"},
            "o": {"type": "object"},
        },
        stats,
    )
    assert got == {"n": "abc", "m": [1, 2], "b": "yes", "f": "NaN", "g": "1e999", "o": "s"}
    assert stats.schema_mismatch_preserved == 6


def test_repeated_parameters_last_value_first_position():
    stats = ArgumentStats()
    got, text = typed(
        [("a", "1"), ("b", "x"), ("a", "2"), ("c", "y"), ("b", "z")],
        {"a": {"type": "integer"}},
        stats,
    )
    assert got == {"a": 2, "b": "z", "c": "y"} and list(got) == ["a", "b", "c"]
    assert stats.duplicate_parameters_repaired == 2
    assert text == '{"a": 2, "b": "z", "c": "y"}'


def test_repeat_with_empty_non_string_value_omits_the_key():
    stats = ArgumentStats()
    got, _ = typed([("a", "1"), ("a", "")], {"a": {"type": "integer"}}, stats)
    assert got == {} and stats.duplicate_parameters_repaired == 1


def test_arguments_preserve_member_order_and_unicode():
    got, text = typed([("z", "1"), ("a", "日本"), ("m", '{"y": 1, "x": 2}')], {})
    assert list(got) == ["z", "a", "m"] and list(got["m"]) == ["y", "x"]
    assert "日本" in text  # not \\u-escaped


@pytest.mark.parametrize(
    ("schema", "types"),
    [
        ({"type": "string"}, {"string"}),
        ({"type": ["integer", "null"]}, {"integer", "null"}),
        (
            {"anyOf": [{"type": "string"}, {"type": ["number", "null"]}]},
            {"string", "number", "null"},
        ),
        ({"oneOf": [{"type": "object"}, {"type": "array"}]}, {"object", "array"}),
        ({"anyOf": [{"type": "string"}, {"$ref": "#/x"}]}, None),
        ({"anyOf": []}, None),
        ({"type": "str"}, None),
        ({"type": []}, None),
        ({"enum": [1, 2]}, None),
        (None, None),
        ("string", None),
    ],
)
def test_admitted_types(schema, types):
    got = admitted_types(schema)
    assert (set(got) if got is not None else None) == types


# --- round trip through the template's rendering rule ---------------------------------------

SAFE_TEXT = ["a", "Z", " ", "\n", "\r", "\t", "é", "日本", "🚀", "<", ">", "/", "=", '"', "{", "[",
             "5", "true", "<tool_call>", "</tool_call>", "<function=f>", "</function>",
             "<parameter=n>v</parameter>", "</parameter>x", "null"]  # fmt: skip


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["string", "integer", "number", "boolean", "null", "array", "object"])
    if depth > 1 and kind in ("array", "object"):
        kind = "string"
    if kind == "string":
        return kind, "".join(rng.choice(SAFE_TEXT) for _ in range(rng.randint(0, 6)))
    if kind == "integer":
        return kind, rng.randint(-(10**20), 10**20)
    if kind == "number":
        return kind, rng.uniform(-1e6, 1e6)
    if kind == "boolean":
        return kind, rng.random() < 0.5
    if kind == "null":
        return kind, None
    if kind == "array":
        return kind, [random_value(rng, depth + 1)[1] for _ in range(rng.randint(0, 3))]
    return kind, {f"k{i}é": random_value(rng, depth + 1)[1] for i in range(rng.randint(0, 3))}


def render_call(name: str, arguments: dict) -> str:
    """The Qwen template's rule: raw text for strings, tojson (HF: json.dumps, ensure_ascii
    off, default separators) for everything else."""
    body = "".join(
        f"<parameter={key}>\n"
        f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        "\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_template_rendered_calls_round_trip_with_their_schema():
    rng = random.Random(2024)
    for _ in range(200):
        properties, arguments = {}, {}
        for i in range(rng.randint(0, 5)):
            kind, value = random_value(rng)
            key = rng.choice(["path", "q", "x_y", "名前"]) + str(i)
            properties[key] = {"type": kind}
            arguments[key] = value
        text = "\n".join(render_call("tool", arguments) for _ in range(rng.randint(1, 2)))
        scan = find_tool_turn(text, declared=frozenset({"tool"}))
        assert scan.turn is not None and scan.turn.start == 0, text
        for parsed in scan.turn.region.calls:
            stats = ArgumentStats()
            rebuilt = build_arguments(parsed.parameters, {"properties": properties}, stats)
            assert rebuilt == json.dumps(arguments, ensure_ascii=False), text
            assert stats == ArgumentStats()
