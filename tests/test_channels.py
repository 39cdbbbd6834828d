"""The streaming output decoder end to end: reasoning, content and tool-call channels.

Each turn is decoded under every two-piece split, char by char and random multi-splits
(channel_harness.decode_all_ways): every segmentation must publish identical channels, calls
and parse report. Streaming-specific promises (what is held back, when it is released) are
checked feed by feed.
"""

from __future__ import annotations

import json
import logging
import random

import pytest

from channel_harness import decode_all_ways, run
from ninfer.outputs.channels import (
    DecoderConfig,
    OutputDecoder,
    ThinkingStart,
    TurnEnd,
    decode_text,
    excerpt,
)

TOOLS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "hours": {"anyOf": [{"type": "array"}, {"type": "null"}]},
        },
    },
    "run": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "noargs": None,
}
ANSWER = DecoderConfig(tools=TOOLS)
THINKING = DecoderConfig(thinking=ThinkingStart.OPEN, tools=TOOLS)
TOLERANT = DecoderConfig(thinking=ThinkingStart.OPEN, tools=TOOLS, tolerant_tool_calls=True)
TOLERANT_ANSWER = DecoderConfig(tools=TOOLS, tolerant_tool_calls=True)


def call(name: str, *params: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    text = f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"
    return text if close else text[: -len("\n</tool_call>")]


WEATHER = call("get_weather", ("city", "Paris"), ("days", "3"))


def args(outcome, index=0):
    return json.loads(outcome.calls[index][1])


def report(outcome) -> dict:
    assert outcome.report is not None
    return dict(outcome.report)


# --- plain and reasoning-only modes ---------------------------------------------------------


def test_plain_mode_streams_everything_immediately():
    text = "Hi <tool_call>\n<function=run>\n</function>\n</tool_call> </think>\n<think>"
    decoder = OutputDecoder(DecoderConfig.plain())
    assert [decoder.feed(ch).content for ch in text] == list(text)
    tail = decoder.finish(TurnEnd.STOP_TOKEN)
    assert tail.tool_calls == [] and tail.report is None and tail.reasoning_tokens == 0
    assert decode_all_ways(text, DecoderConfig.plain()).content == text


def test_reasoning_without_tools_keeps_markup_as_text():
    text = "think " + WEATHER + "\n</think>\n\n" + WEATHER
    outcome = decode_all_ways(text, DecoderConfig(thinking=ThinkingStart.OPEN))
    assert outcome.reasoning == "think " + WEATHER and outcome.content == WEATHER
    assert outcome.calls == () and outcome.report is None


# --- structured turns -----------------------------------------------------------------------


def test_reasoning_content_and_call():
    text = "Need weather.\n</think>\n\nLet me check.\n\n" + WEATHER
    outcome = decode_all_ways(text, THINKING)
    assert outcome.reasoning == "Need weather." and outcome.content == "Let me check.\n\n"
    assert outcome.calls == (("get_weather", '{"city": "Paris", "days": 3}'),)
    assert report(outcome) == {
        "marker_seen": True,
        "structured_call_count": 1,
        "empty_non_string_omitted": 0,
        "schema_mismatch_preserved": 0,
        "duplicate_parameters_repaired": 0,
        "fallback_reason": "none",
        "tolerant_recovered": False,
        "recovered_from_reasoning": False,
    }


def test_multiple_calls_with_stable_indices_and_unique_ids():
    text = WEATHER + "\n" + call("run", ("cmd", "ls -la")) + "\n" + call("noargs") + "\n"
    outcome = decode_all_ways(text, ANSWER)
    assert outcome.content == ""
    assert [name for name, _ in outcome.calls] == ["get_weather", "run", "noargs"]
    assert args(outcome, 1) == {"cmd": "ls -la"} and args(outcome, 2) == {}
    decoder = OutputDecoder(ANSWER, call_id_factory=iter(["call_a", "call_b", "call_c"]).__next__)
    decoder.feed(text)
    tail = decoder.finish(TurnEnd.STOP_TOKEN)
    assert [(c.index, c.id) for c in tail.tool_calls] == [
        (0, "call_a"),
        (1, "call_b"),
        (2, "call_c"),
    ]


def test_typed_parameters_and_counters():
    text = call(
        "get_weather",
        ("city", ""),
        ("days", ""),
        ("metric", "True"),
        ("hours", "[9, 12]"),
        ("days", "5"),
        ("extra", '{"k": 1}'),
        ("city", "Zürich"),
    )
    outcome = decode_all_ways(text, ANSWER)
    assert outcome.calls[0][1] == (
        '{"city": "Zürich", "days": 5, "metric": true, "hours": [9, 12], "extra": {"k": 1}}'
    )
    assert report(outcome)["duplicate_parameters_repaired"] == 2


def test_empty_and_mismatched_values_through_the_decoder():
    text = call("get_weather", ("city", ""), ("days", "soon"), ("hours", ""), ("metric", "1"))
    outcome = decode_all_ways(text, ANSWER)
    assert args(outcome) == {"city": "", "days": "soon", "metric": 1}
    assert report(outcome)["empty_non_string_omitted"] == 1
    assert report(outcome)["schema_mismatch_preserved"] == 2


def test_nested_markup_and_quoted_closers_in_string_values():
    cmd = (
        "printf '<tool_call>\\n<function=x>\\n</function>' && "
        "echo '</parameter>' && echo '<parameter=a>b</parameter>'"
    )
    outcome = decode_all_ways("Running:\n" + call("run", ("cmd", cmd)), ANSWER)
    assert outcome.content == "Running:\n" and args(outcome) == {"cmd": cmd}


def test_unicode_everywhere():
    text = "想一想 🙂\n</think>\n\nVoilà — 天気:\n" + call("get_weather", ("city", "東京 🗼"))
    outcome = decode_all_ways(text, THINKING)
    assert outcome.reasoning == "想一想 🙂" and outcome.content == "Voilà — 天気:\n"
    assert args(outcome) == {"city": "東京 🗼"}


# --- fallback to text -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (WEATHER + "\nHope that helps!", "trailing_content"),
        (call("get_weather", ("city", "x"), close=False), "malformed_structure"),
        (call("unknown_tool", ("a", "1")), "undeclared_tool"),
        (call("bad name"), "invalid_tool_name"),
        (call("run", ("cmd", "echo <parameter=x>")), "malformed_structure"),
        (call("run", ("cmd", "echo '</parameter>\n</function>'")), "malformed_structure"),
        ("Use <tool_call> tags.", "malformed_structure"),
    ],
)
def test_malformed_markup_is_returned_as_text_without_losing_bytes(text, reason, caplog):
    caplog.set_level(logging.INFO, logger="ninfer.outputs")
    outcome = decode_all_ways("Answer: " + text, ANSWER)
    assert outcome.content == "Answer: " + text and outcome.calls == ()
    assert report(outcome)["fallback_reason"] == reason and report(outcome)["marker_seen"]
    caplog.clear()
    decode_text("Answer: " + text, ANSWER, TurnEnd.STOP_TOKEN)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    markup = text[text.index("<tool_call>") :]
    assert warnings[0].getMessage() == f"tool call returned as text ({reason}): {excerpt(markup)}"


def test_excerpt_format():
    assert excerpt("<tool_call>\n\tx\r\n") == "<tool_call>  x  "
    long = "<tool_call>" + "é" * 200
    shown = excerpt(long)
    assert shown.endswith("...") and len(shown[:-3].encode()) <= 240
    assert len(shown[:-3].encode()) >= 239  # cut at a character boundary


def test_quoted_markup_before_the_real_call_stays_content(caplog):
    quoted = "The format is <tool_call>...</tool_call>, so:\n"
    outcome = decode_all_ways(quoted + WEATHER, ANSWER)
    assert outcome.content == quoted and args(outcome) == {"city": "Paris", "days": 3}
    assert report(outcome)["structured_call_count"] == 1
    assert report(outcome)["fallback_reason"] == "none"
    caplog.clear()
    decode_text(quoted + WEATHER, ANSWER, TurnEnd.STOP_TOKEN)
    assert caplog.records == []


def test_no_tool_calls_without_marker():
    outcome = decode_all_ways("Just <b>text</b> <tool and <function=run> here", ANSWER)
    assert outcome.content == "Just <b>text</b> <tool and <function=run> here"
    assert report(outcome)["marker_seen"] is False
    assert report(outcome)["fallback_reason"] == "none"


# --- streaming holds ------------------------------------------------------------------------


def test_only_an_ambiguous_marker_prefix_is_held():
    decoder = OutputDecoder(ANSWER)
    assert decoder.feed("Hello <").content == "Hello "
    assert decoder.feed("tool_").content == ""
    assert decoder.feed("box> and <").content == "<tool_box> and "
    assert decoder.feed("tool_call>").content == ""
    assert decoder.feed("\n<function=run>\n").content == ""
    tail = decoder.finish(TurnEnd.STOP_TOKEN)
    assert tail.delta.content == "<tool_call>\n<function=run>\n" and tail.tool_calls == []


def test_dead_region_is_released_before_the_end():
    decoder = OutputDecoder(ANSWER)
    assert decoder.feed("x <tool_call>").content == "x "
    released = decoder.feed(" is the tag for calls, and it is followed by prose " * 2).content
    assert released.startswith("<tool_call> is the tag")
    assert decoder.feed(" more").content == " more"
    decoder.finish(TurnEnd.STOP_TOKEN)


def test_live_region_is_held_until_the_end():
    decoder = OutputDecoder(ANSWER)
    published = "".join(decoder.feed(ch).content for ch in "Ok.\n" + WEATHER)
    assert published == "Ok.\n"
    tail = decoder.finish(TurnEnd.STOP_TOKEN)
    assert tail.delta.content == "" and len(tail.tool_calls) == 1


# --- tolerant mode --------------------------------------------------------------------------


def test_tolerant_discards_suffix_after_complete_call(caplog):
    caplog.set_level(logging.INFO, logger="ninfer.outputs")
    text = "Checking.\n" + WEATHER + "\nI called the tool."
    outcome = decode_all_ways(text, TOLERANT_ANSWER)
    assert outcome.content == "Checking.\n" and len(outcome.calls) == 1
    assert report(outcome)["fallback_reason"] == "truncated_tail"
    assert report(outcome)["tolerant_recovered"] is True
    caplog.clear()
    decode_text(text, TOLERANT_ANSWER, TurnEnd.STOP_TOKEN)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_tolerant_recovers_call_cut_by_output_budget():
    text = WEATHER + "\n" + call("run", ("cmd", "make test"), close=False)[:-3]
    outcome = decode_all_ways(text, TOLERANT_ANSWER, TurnEnd.LENGTH)
    assert [name for name, _ in outcome.calls] == ["get_weather", "run"]
    assert args(outcome, 1) == {"cmd": "make test"}
    assert report(outcome)["fallback_reason"] == "truncated_tail"
    strict = decode_all_ways(text, ANSWER, TurnEnd.LENGTH)
    assert strict.calls == () and strict.content == text


def test_tolerant_repairs_missing_bracket_and_keeps_undeclared_name():
    text = (
        "<tool_call>\n<function=run\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
    )
    outcome = decode_all_ways(text, TOLERANT_ANSWER)
    assert outcome.calls == (("run", '{"cmd": "ls"}'),)
    assert report(outcome)["tolerant_recovered"] and report(outcome)["fallback_reason"] == "none"
    outcome = decode_all_ways(call("mystery", ("q", "1")), TOLERANT_ANSWER)
    assert outcome.calls == (("mystery", '{"q": 1}'),) and report(outcome)["tolerant_recovered"]


def test_tolerant_region_without_a_call_is_text_with_truncated_tail():
    text = "Sure: <tool_call>\n<function=get_wea"
    outcome = decode_all_ways(text, TOLERANT_ANSWER, TurnEnd.LENGTH)
    assert outcome.content == text and outcome.calls == ()
    assert report(outcome)["fallback_reason"] == "truncated_tail"
    assert report(outcome)["structured_call_count"] == 0


# --- calls inside thinking ------------------------------------------------------------------

STRANDED = "I should call the tool.\n\n" + WEATHER + "\n"


def test_calls_in_closed_thinking_stay_reasoning():
    for config in (THINKING, TOLERANT):
        outcome = decode_all_ways(STRANDED + "</think>\n\nNo call after all.", config)
        assert (
            outcome.reasoning == STRANDED.rstrip("\n") and outcome.content == "No call after all."
        )
        assert outcome.calls == () and report(outcome)["marker_seen"] is False


def test_strict_mode_never_recovers_from_thinking():
    outcome = decode_all_ways(STRANDED, THINKING)
    assert outcome.reasoning == STRANDED.rstrip("\n") and outcome.calls == ()


def test_tolerant_recovers_complete_calls_stranded_in_unclosed_thinking(caplog):
    caplog.set_level(logging.INFO, logger="ninfer.outputs")
    text = STRANDED + call("noargs") + "\n"
    outcome = decode_all_ways(text, TOLERANT)
    assert outcome.reasoning == "I should call the tool.\n\n" and outcome.content == ""
    assert [name for name, _ in outcome.calls] == ["get_weather", "noargs"]
    assert report(outcome)["recovered_from_reasoning"] is True
    caplog.clear()
    decode_text(text, TOLERANT, TurnEnd.STOP_TOKEN)
    assert [r.getMessage() for r in caplog.records] == [
        "tool calls recovered from unclosed thinking: 2 structured call(s)"
    ]


@pytest.mark.parametrize(
    ("text", "end"),
    [
        (STRANDED, TurnEnd.LENGTH),
        (STRANDED, TurnEnd.CANCELLED),
        (STRANDED, TurnEnd.STOP_STRING),
        (STRANDED + "Then I will summarize.", TurnEnd.STOP_TOKEN),  # prose after the call
        (STRANDED + call("run", ("cmd", "ls"), close=False), TurnEnd.STOP_TOKEN),  # a cut call
        ("Hmm. " + call("undeclared_tool"), TurnEnd.STOP_TOKEN),
    ],
)
def test_tolerant_thinking_recovery_conditions(text, end):
    outcome = decode_all_ways(text, TOLERANT, end)
    assert outcome.calls == () and outcome.content == ""
    assert outcome.reasoning == text.rstrip("\n")


def test_tolerant_thinking_hold_streams_until_a_marker_and_releases_at_close():
    decoder = OutputDecoder(TOLERANT)
    assert decoder.feed("plan: ").reasoning == "plan: "
    assert decoder.feed(WEATHER).reasoning == ""  # may become the structured turn
    delta = decoder.feed("\nNo, answer directly.</think>\n\nHi")
    assert delta.reasoning == WEATHER + "\nNo, answer directly."
    assert decoder.reasoning == "plan: " + WEATHER + "\nNo, answer directly."
    assert delta.content == "Hi"


def test_tolerant_thinking_hold_releases_dead_regions_early():
    decoder = OutputDecoder(TOLERANT)
    decoder.feed("The syntax <tool_call>")
    released = decoder.feed(" wraps a function element; I will use it later. " * 2).reasoning
    assert released.startswith("<tool_call> wraps")


# --- segmentation fuzz ----------------------------------------------------------------------

ATOMS = [
    "</think>", "</think>\n", "\n", " ", "a", "é", "<", "<tool_", "</tool_call>",
    "<tool_call>", "<function=run>", "<function=noargs>", "</function>", "<parameter=cmd>",
    "</parameter>", WEATHER, call("noargs"), call("run", ("cmd", "x </parameter> y")),
]  # fmt: skip


def random_turn(rng: random.Random, thinking: bool) -> str:
    def part(n: int) -> str:
        return "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, n)))

    def answer() -> str:
        if rng.random() < 0.5:
            return part(6)
        calls = [rng.choice(ATOMS[-3:]) for _ in range(rng.randint(1, 3))]
        text = rng.choice(["", "Sure.\n", "<tool_call> quoted\n"]) + "\n".join(calls)
        if rng.random() < 0.4:  # a mutation somewhere
            at = rng.randrange(len(text) + 1)
            text = text[:at] + rng.choice(ATOMS[:-3]) + text[at:]
        return text

    if thinking and rng.random() < 0.7:
        return part(4) + rng.choice(["</think>\n", "</think>\n\n", "</think>"]) + answer()
    return answer()


@pytest.mark.parametrize(
    "config", [THINKING, TOLERANT, TOLERANT_ANSWER, DecoderConfig(tools=TOOLS)]
)
def test_random_turns_agree_under_all_segmentations(config):
    rng = random.Random(len(config.thinking.value) * 2 + config.tolerant_tool_calls)
    for _ in range(16):
        text = random_turn(rng, config.thinking is ThinkingStart.OPEN)
        end = rng.choice([TurnEnd.STOP_TOKEN, TurnEnd.LENGTH])
        outcome = decode_all_ways(text, config, end, seed=rng.randint(0, 999))
        if not outcome.calls:  # nothing structured: every answer byte is published
            reasoning_only = run([text], DecoderConfig(thinking=config.thinking), end)
            assert outcome.content == reasoning_only.content


def test_feed_after_finish_is_an_error():
    decoder = OutputDecoder(ANSWER)
    decoder.finish(TurnEnd.STOP_TOKEN)
    with pytest.raises(RuntimeError):
        decoder.feed("x")
    with pytest.raises(RuntimeError):
        decoder.finish(TurnEnd.STOP_TOKEN)


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason", "end"),
    [
        ("stop", 248046, TurnEnd.STOP_TOKEN),
        ("stop", "###", TurnEnd.STOP_STRING),
        ("length", None, TurnEnd.LENGTH),
        ("cancelled", None, TurnEnd.CANCELLED),
        ("error", None, TurnEnd.ERROR),
    ],
)
def test_turn_end_from_engine_event(finish_reason, stop_reason, end):
    assert TurnEnd.from_engine(finish_reason, stop_reason) is end
