"""Reasoning/answer split: closing rules, quoted markers, start modes, token accounting.

Every text is decoded under every two-piece split, char by char and random multi-splits;
all segmentations must publish the same channels (channel_harness.decode_all_ways).
"""

from __future__ import annotations

import random

import pytest

from channel_harness import decode_all_ways, run
from ninfer.outputs.channels import (
    QWEN3_5_THINK_END_ID,
    DecoderConfig,
    OutputDecoder,
    ThinkingStart,
    TurnEnd,
)
from ninfer.outputs.reasoning import ReasoningSplitter

OPEN = DecoderConfig(thinking=ThinkingStart.OPEN)
MODEL = DecoderConfig(thinking=ThinkingStart.MODEL)


def split(text: str, config: DecoderConfig = OPEN, end: TurnEnd = TurnEnd.STOP_TOKEN):
    outcome = decode_all_ways(text, config, end)
    return outcome.reasoning, outcome.content


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("Let me think.\n</think>\n\nThe answer is 4.", "Let me think.", "The answer is 4."),
        ("plan</think>\nanswer", "plan", "answer"),
        ("plan</think>\r\nanswer", "plan", "answer"),
        ("\n\nplan\n\n\n</think>\n\n\nanswer\n\nmore", "plan", "answer\n\nmore"),
        # the end of the turn closes too
        ("all reasoning</think>", "all reasoning", ""),
        ("all reasoning\n</think>", "all reasoning", ""),
        # a turn that never closes is all reasoning (trailing line breaks are framing)
        ("still thinking\n", "still thinking", ""),
        ("", "", ""),
        ("</think>\n\nanswer only", "", "answer only"),
    ],
)
def test_reasoning_closes_at_marker_and_line_break_or_end(text, reasoning, content):
    assert split(text) == (reasoning, content)


@pytest.mark.parametrize("follower", [" ", ".", ",", ")", "`", '"', "x", "\\", "<", "é"])
def test_quoted_marker_stays_reasoning(follower):
    text = f"The tag </think>{follower}ends thinking.\n</think>\n\nDone."
    assert split(text) == (f"The tag </think>{follower}ends thinking.", "Done.")


def test_quoted_marker_then_end_of_turn_without_close():
    # a quoted marker followed by text never closes; the turn ends inside reasoning
    assert split("say `</think>` and stop") == ("say `</think>` and stop", "")


def test_partial_markers_are_reasoning_text():
    text = "</thin> and </think and </ think>\n</think>\nok"
    assert split(text) == ("</thin> and </think and </ think>", "ok")


def test_markers_after_close_are_content():
    text = "r</think>\n\nanswer </think>\n<think>\nmore"
    assert split(text) == ("r", "answer </think>\n<think>\nmore")


def test_closed_mode_is_plain_content():
    text = "no thinking</think>\n here\n"
    assert split(text, DecoderConfig()) == ("", text)
    assert split(text, DecoderConfig.plain()) == ("", text)


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\nhmm\n</think>\n\nanswer", "hmm", "answer"),
        ("\n <think>hmm</think>\nanswer", "hmm", "answer"),
        ("<think>hmm", "hmm", ""),
        ("answer <think>x</think>\n", "", "answer <think>x</think>\n"),
        ("<thinking>x", "", "<thinking>x"),
        ("<thi", "", "<thi"),
        ("  \n", "", "  \n"),
        ("", "", ""),
    ],
)
def test_model_opened_reasoning(text, reasoning, content):
    assert split(text, MODEL) == (reasoning, content)


def test_unicode_reasoning_and_content():
    text = "思考中…🙂 </think>» still\n</think>\n\nRéponse: ∑ 🚀"
    assert split(text) == ("思考中…🙂 </think>» still", "Réponse: ∑ 🚀")


def test_streaming_holds_only_the_ambiguous_part():
    decoder = OutputDecoder(OPEN)
    assert decoder.feed("abc").reasoning == "abc"
    assert decoder.feed("\n\n").reasoning == ""  # line breaks held: they may precede the closer
    assert decoder.feed("</thi").reasoning == ""
    assert decoder.feed("nk>").reasoning == ""  # complete marker, next char decides
    delta = decoder.feed(" quoted")
    assert delta.reasoning == "\n\n</think> quoted" and delta.content == ""
    delta = decoder.feed("</think>\n")
    assert delta.reasoning == "" and delta.content == ""
    delta = decoder.feed("\nanswer")
    assert delta.reasoning == "" and delta.content == "answer"
    assert decoder.finish(TurnEnd.STOP_TOKEN).delta.content == ""
    assert decoder.reasoning == "abc\n\n</think> quoted"


def test_splitter_reports_close_offset():
    splitter = ReasoningSplitter(ThinkingStart.OPEN)
    splitter.feed("ab</think>")
    assert not splitter.closed
    assert splitter.feed("\nc") == ("", "c")
    assert splitter.close_end == len("ab</think>")


def test_random_texts_agree_under_all_segmentations():
    rng = random.Random(7)
    atoms = ["</think>", "</think>\n", "<think>", "\n", "\r\n", " ", ".", "a", "é", "</thi", "<"]
    for _ in range(60):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 14)))
        for config in (OPEN, MODEL, DecoderConfig()):
            outcome = decode_all_ways(text, config, seed=rng.randint(0, 99))
            # channel text is always made of the input's characters, in order
            assert len(outcome.reasoning) + len(outcome.content) <= len(text)


# --- reasoning_tokens ----------------------------------------------------------------------

THINK_END = QWEN3_5_THINK_END_ID
QWEN = DecoderConfig(thinking=ThinkingStart.OPEN, think_end_token_id=THINK_END)


def tokens_of(pieces: list[tuple[str, int]], groups: list[int]):
    """Groups consecutive (text, id) tokens into feeds of the given sizes."""
    texts, ids, at = [], [], 0
    for size in groups:
        chunk = pieces[at : at + size]
        texts.append("".join(t for t, _ in chunk))
        ids.append([i for _, i in chunk])
        at += size
    assert at == len(pieces)
    return texts, ids


def random_groups(rng: random.Random, n: int) -> list[int]:
    groups = []
    while n:
        size = rng.randint(1, min(n, 4))
        groups.append(size)
        n -= size
    return groups


def check_reasoning_tokens(tokens: list[tuple[str, int]], expected: int, config=QWEN, end=None):
    rng = random.Random(3)
    end = end or TurnEnd.STOP_TOKEN
    results = set()
    for groups in (
        [1] * len(tokens),
        [len(tokens)],
        *(random_groups(rng, len(tokens)) for _ in range(30)),
    ):
        texts, ids = tokens_of(tokens, groups)
        results.add(run(texts, config, end, ids).reasoning_tokens)
    assert results == {expected}


def test_reasoning_tokens_count_through_special_closer():
    tokens = [("Let", 1), (" me", 2), (" see", 3), ("\n", 198), ("</think>", THINK_END),
              ("\n\n", 271), ("Hi", 5), ("!", 6), ("", 248046)]  # fmt: skip
    check_reasoning_tokens(tokens, 5)


def test_reasoning_tokens_skip_quoted_special_markers():
    tokens = [("a", 1), ("</think>", THINK_END), (" b", 2), ("</think>", THINK_END),
              (".", 3), ("</think>", THINK_END), ("\n", 198), ("c", 4)]  # fmt: skip
    check_reasoning_tokens(tokens, 6)


def test_reasoning_tokens_unclosed_and_off():
    tokens = [("a", 1), ("b", 2), ("", 248046)]
    check_reasoning_tokens(tokens, 3)
    check_reasoning_tokens(tokens, 0, config=DecoderConfig(think_end_token_id=THINK_END))


def test_reasoning_tokens_with_model_opened_thinking():
    model = DecoderConfig(thinking=ThinkingStart.MODEL, think_end_token_id=THINK_END)
    tokens = [("<think>", 248068), ("\n", 198), ("x", 1), ("</think>", THINK_END), ("\n\n", 271),
              ("y", 2)]  # fmt: skip
    check_reasoning_tokens(tokens, 4, config=model)
    check_reasoning_tokens([("y", 2), ("<think>", 248068)], 0, config=model)


def test_reasoning_tokens_with_marker_spelled_in_ordinary_tokens():
    # one token per feed stays exact even when `</think>` is not the special token
    tokens = [("a", 1), ("</", 10), ("think", 11), (">", 12), ("\n", 198), ("b", 2)]
    texts, ids = tokens_of(tokens, [1] * len(tokens))
    assert run(texts, QWEN, TurnEnd.STOP_TOKEN, ids).reasoning_tokens == 4


def test_reasoning_tokens_closer_at_end_of_turn():
    tokens = [("a", 1), ("</think>", THINK_END), ("", 248046)]
    check_reasoning_tokens(tokens, 2)


@pytest.mark.parametrize(
    ("prompt", "start"),
    [
        ("<|im_start|>assistant\n<think>\n", ThinkingStart.OPEN),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", ThinkingStart.CLOSED),
        ("<|im_start|>assistant\n", ThinkingStart.CLOSED),
    ],
)
def test_thinking_start_after_prompt(prompt, start):
    assert ThinkingStart.after_prompt(prompt) is start


def test_reasoning_complete_signals_when_the_block_can_close():
    decoder = OutputDecoder(OPEN)
    decoder.feed("r</think>")
    assert not decoder.reasoning_complete
    decoder.feed("\n")
    assert decoder.reasoning_complete
    assert OutputDecoder(DecoderConfig()).reasoning_complete
    model = OutputDecoder(MODEL)
    model.feed(" <thi")
    assert not model.reasoning_complete
    model.feed("s is not thinking")
    assert model.reasoning_complete and model.reasoning == ""
