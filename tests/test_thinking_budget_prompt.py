"""The Python half of thinking budgets: the close sequence, the capacity rule, the flags."""

from __future__ import annotations

import pytest

from ninfer.outputs.channels import ThinkingStart
from ninfer.protocols.thinking_budget import QWEN_GUIDANCE, ThinkingClose, plan_thinking_budget
from ninfer.server.errors import ApiError
from ninfer.server.options import parse_args

OPEN, CLOSE = 1000, 1001


class Tokenizer:
    """One token per character (its code point), plus the two thinking markers."""

    def token_to_id(self, token):
        return {"<think>": OPEN, "</think>": CLOSE}.get(token)

    def encode(self, text, *, allow_special=True):
        assert not allow_special  # the guidance is text, the marker is added by id
        return [ord(c) for c in text]


def chars(text):
    return [ord(c) for c in text]


def test_default_close_is_qwen_guidance_marker_and_line_break():
    close = ThinkingClose.build(Tokenizer(), None)
    assert list(close.ids) == [*chars(QWEN_GUIDANCE), CLOSE, *chars("\n\n")]
    assert (close.open_id, close.close_id) == (OPEN, CLOSE)


def test_custom_message_gets_the_marker_when_it_lacks_it():
    assert list(ThinkingClose.build(Tokenizer(), "Enough.").ids) == [
        *chars("Enough."),
        CLOSE,
        *chars("\n\n"),
    ]
    assert list(ThinkingClose.build(Tokenizer(), "Stop.</think>\n").ids) == [
        *chars("Stop."),
        CLOSE,
        *chars("\n"),
    ]


def test_no_close_marker_means_no_budget():
    class Plain:
        def token_to_id(self, token):
            return None

    assert ThinkingClose.build(Plain(), None) is None


def test_capacity_rule():
    close = ThinkingClose.build(Tokenizer(), "x")  # x, </think>, \n, \n: four tokens
    assert plan_thinking_budget(close, ThinkingStart.CLOSED, 10, 100, "p") is None
    assert plan_thinking_budget(close, ThinkingStart.OPEN, None, 100, "p") is None
    assert plan_thinking_budget(close, ThinkingStart.OPEN, 100, 100, "p") is None  # never acts
    budget = plan_thinking_budget(close, ThinkingStart.OPEN, 10, 15, "p")  # 10 + 4 + 1
    assert (budget.limit, budget.starts_open, budget.close_id) == (10, True, CLOSE)
    model_opened = plan_thinking_budget(close, ThinkingStart.MODEL, 10, 15, "p")
    assert (model_opened.starts_open, model_opened.open_id) == (False, OPEN)
    with pytest.raises(ApiError) as info:
        plan_thinking_budget(close, ThinkingStart.OPEN, 10, 14, "max_tokens")
    assert info.value.code == "thinking_budget_capacity_insufficient"
    assert info.value.param == "max_tokens"


def test_flags():
    args = parse_args(["--default-thinking-budget", "512", "--thinking-budget-message", "Done."])
    assert (args.default_thinking_budget, args.thinking_budget_message) == (512, "Done.")
    assert parse_args([]).default_thinking_budget is None
    with pytest.raises(SystemExit):
        parse_args(["--default-thinking-budget", "0"])
