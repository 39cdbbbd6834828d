"""NInfer's Qwen3.5/3.6 chat template against each rule of the model spec (§6.2)."""

from __future__ import annotations

import json

import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.prompt.builtin_templates import builtin_template, template_for_architecture

SOURCE = builtin_template("qwen3_5")


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    # As Hugging Face renders templates: sandboxed, trim/lstrip blocks, its own tojson.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env


TEMPLATE = _environment().from_string(SOURCE)


def render(messages, add_generation_prompt=True, **kwargs) -> str:
    return TEMPLATE.render(messages=messages, add_generation_prompt=add_generation_prompt, **kwargs)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle — current weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK_TOOL = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


def test_single_user_turn_with_thinking_on_by_default():
    out = render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_thinking_off_adds_empty_think_block():
    out = render([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render([{"role": "user", "content": "hi"}], enable_thinking=True).endswith(
        "<|im_start|>assistant\n<think>\n"
    )


def test_no_generation_prompt():
    out = render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert out == "<|im_start|>user\nhi<|im_end|>\n"


def test_system_without_tools_and_content_trimming():
    out = render(
        [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "\n hi  \n"}]
    )
    assert out.startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


def test_tools_block_precedes_system_prompt():
    out = render(
        [{"role": "system", "content": " You are a bot. "}, {"role": "user", "content": "hi"}],
        tools=[WEATHER_TOOL, CLOCK_TOOL],
    )
    system, rest = out.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\n# Tools\n")
    tool_lines = "<tools>\n" + "\n".join(
        json.dumps(t, ensure_ascii=False) for t in (WEATHER_TOOL, CLOCK_TOOL)
    )
    assert tool_lines + "\n</tools>" in system
    assert "Météo" in system  # tojson keeps non-ASCII text
    assert '{"type": "function", "function": {"name": "get_weather"' in system  # key order kept
    assert "<tool_call>\n<function=" in system and "<IMPORTANT>" in system
    assert system.endswith("</IMPORTANT>\n\nYou are a bot.")
    assert system.index("</tools>") < system.index("You are a bot.")
    assert rest.startswith("<|im_start|>user\nhi<|im_end|>\n")


def test_tools_without_system_prompt_and_empty_tools():
    out = render([{"role": "user", "content": "hi"}], tools=[CLOCK_TOOL])
    assert out.startswith("<|im_start|>system\n# Tools")
    assert "</IMPORTANT><|im_end|>\n<|im_start|>user\nhi" in out
    assert render([{"role": "user", "content": "hi"}], tools=[]) == render(
        [{"role": "user", "content": "hi"}]
    )


@pytest.mark.parametrize(
    "messages,error",
    [
        ([{"role": "system", "content": "only"}], "No user query"),
        ([], "No messages"),
    ],
)
def test_rejected_conversations(messages, error):
    with pytest.raises(jinja2.TemplateError, match=error):
        render(messages)


def test_consecutive_tool_results_merge_into_one_user_turn():
    out = render(
        [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "now", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": " sunny "},
            {"role": "tool", "content": "22C"},
        ]
    )
    expected = (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n22C\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert out.endswith(expected)
    assert out.count("<|im_start|>user") == 2


HISTORY = [
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "answer one", "reasoning_content": "old thoughts"},
    {"role": "user", "content": "second"},
    {"role": "assistant", "content": "<think>\ninline thoughts\n</think>\n\nanswer two"},
]


def test_historical_reasoning_is_dropped():
    out = render(HISTORY + [{"role": "user", "content": "third"}])
    assert "<|im_start|>assistant\nanswer one<|im_end|>\n" in out
    assert "<|im_start|>assistant\nanswer two<|im_end|>\n" in out
    assert "old thoughts" not in out and "inline thoughts" not in out


def test_preserve_thinking_keeps_all_reasoning():
    out = render(HISTORY + [{"role": "user", "content": "third"}], preserve_thinking=True)
    assert "<|im_start|>assistant\n<think>\nold thoughts\n</think>\n\nanswer one<|im_end|>" in out
    assert (
        "<|im_start|>assistant\n<think>\ninline thoughts\n</think>\n\nanswer two<|im_end|>" in out
    )


def test_turns_after_last_query_keep_reasoning_even_if_empty():
    out = render(HISTORY, add_generation_prompt=False)
    # The last assistant turn follows the last user query: reasoning (from content) kept.
    assert out.endswith(
        "<|im_start|>assistant\n<think>\ninline thoughts\n</think>\n\nanswer two<|im_end|>\n"
    )
    out = render([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n" in out


def test_agentic_turn_keeps_reasoning_across_tool_results():
    messages = [
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer", "reasoning_content": "old r"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "need the tool",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
        # a user turn that only carries tool results is not a new query
        {"role": "user", "content": "<tool_response>\nrain later\n</tool_response>"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "got it"},
    ]
    out = render(messages, add_generation_prompt=False)
    assert "old r" not in out
    assert "<think>\nneed the tool\n</think>\n\nLet me check." in out
    assert "<think>\ngot it\n</think>\n\nSunny.<|im_end|>" in out


def test_tool_call_format():
    out = render(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "Calling.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": {"city": "Zürich", "days": 3, "opts": {"a": [1, "x"]}},
                        },
                    },
                    {"function": {"name": "now", "arguments": {}}},
                ],
            },
        ],
        add_generation_prompt=False,
    )
    expected_calls = (
        "Calling.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nZürich\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n"
        '<parameter=opts>\n{"a": [1, "x"]}\n</parameter>\n'
        "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>"
        "<|im_end|>\n"
    )
    assert out.endswith(expected_calls)


def test_tool_call_without_content_has_no_leading_blank_line():
    out = render(
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": "now", "arguments": {}}},
                ],
            },
        ],
        add_generation_prompt=False,
    )
    assert out.endswith(
        "</think>\n\n<tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n"
    )


def test_json_string_arguments_are_refused():
    with pytest.raises(jinja2.TemplateError, match="mapping"):
        render(
            [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "now", "arguments": "{}"}},
                    ],
                },
            ]
        )


def test_vision_items_and_numbering():
    content = [
        {"type": "text", "text": "Compare "},
        {"type": "image", "image": "a.png"},
        {"type": "image_url", "image_url": {"url": "b.png"}},
        {"type": "video", "video": "c.mp4"},
    ]
    out = render([{"role": "user", "content": content}])
    assert out.startswith(
        "<|im_start|>user\nCompare <|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>"
    )
    numbered = render([{"role": "user", "content": content}], add_vision_id=True)
    assert "Picture 1: <|vision_start|>" in numbered and "Picture 2: " in numbered
    assert "Video 1: <|vision_start|><|video_pad|>" in numbered


def test_renders_identically_through_transformers():
    chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    messages = HISTORY + [{"role": "user", "content": "third"}]
    rendered, _ = chat_utils.render_jinja_template(
        conversations=[messages],
        tools=[WEATHER_TOOL],
        chat_template=SOURCE,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert rendered[0] == render(messages, tools=[WEATHER_TOOL], enable_thinking=False)


def test_architecture_lookup():
    assert template_for_architecture("qwen3_5_moe") == SOURCE
    assert template_for_architecture("llama") is None
    with pytest.raises(KeyError, match="qwen3_5"):
        builtin_template("nope")


def test_answer_after_inline_reasoning_keeps_its_indentation():
    # Only the newlines after </think> are dropped, as in the official template.
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\n  indented"},
        {"role": "user", "content": "again"},
    ]
    assert "<|im_start|>assistant\n  indented<|im_end|>" in render(messages)


def test_preserve_thinking_must_be_true_not_just_truthy():
    out = render(HISTORY + [{"role": "user", "content": "third"}], preserve_thinking="yes")
    assert "old thoughts" not in out


def test_system_message_cannot_hold_media():
    system = {"role": "system", "content": [{"type": "image", "image": "a.png"}]}
    with pytest.raises(jinja2.TemplateError, match="System message cannot contain images"):
        render([system, {"role": "user", "content": "hi"}])


def test_later_system_and_developer_messages_keep_their_position():
    out = render(
        [
            {"role": "developer", "content": " first "},
            {"role": "user", "content": "a"},
            {"role": "system", "content": "late"},
            {"role": "developer", "content": "later"},
            {"role": "user", "content": "b"},
        ]
    )
    assert out.startswith("<|im_start|>system\nfirst<|im_end|>\n<|im_start|>user\na<|im_end|>\n")
    assert (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nlate<|im_end|>\n"
        "<|im_start|>system\nlater<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
    ) in out
