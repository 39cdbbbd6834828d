"""The one prompt path: a normalized conversation -> rendered, encoded prompt + decoder setup.

Protocol adapters (Chat Completions, /tokenize, later Responses and Anthropic Messages)
lower their wire messages to `Conversation` and call `render_conversation`; everything that
decides what the model sees happens here, once:

* messages enter the template in input order (developer becomes system); assistant history
  carries its reasoning and tool calls (arguments as JSON objects, member order as received);
  tool results keep their call id;
* tools are rendered through the template (custom tools as a one-string `input` function
  under the caller's name);
* template options resolve through prompt/template_options.py;
* a final assistant message is a prefill that generation continues in place; it is refused
  with invalid_prompt when it carries media or thinking is not explicitly disabled;
* control-token spellings in content, tool data and kwargs are encoded as text
  (prompt/literal_text.py);
* the output decoder's configuration follows from the render: reasoning open at the start
  when the prompt ends with the opener, tool parsing when tools are callable and the template
  speaks the Qwen tool-call format.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ninfer.outputs.channels import DecoderConfig, ThinkingStart
from ninfer.prompt import TemplateError
from ninfer.prompt.cache_marks import frontiers, take_marks, with_marks
from ninfer.prompt.literal_text import LiteralText, special_spellings
from ninfer.prompt.template_options import (
    ResolvedOptions,
    TemplateOptionError,
    TemplateOptions,
    resolve_template_options,
)
from ninfer.protocols.served_model import ServedModel
from ninfer.server.errors import ApiError, invalid

# Marks where a final assistant message's content ends, so generation continues in place.
_PREFILL_SENTINEL = "\uffff\u2063ninfer-prefill-end\u2063\uffff"
CUSTOM_TOOL_INPUT = "input"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass(slots=True)
class HistoricalToolCall:
    name: str
    arguments: Any  # a JSON object (dict, received member order) or the raw string
    id: str | None = None


@dataclass(slots=True)
class PromptMessage:
    role: str  # system | developer | user | assistant | tool
    content: str = ""
    reasoning: str | None = None  # assistant reasoning history
    tool_calls: list[HistoricalToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    has_media: bool = False
    param: str = "messages"  # where it came from, for errors


@dataclass(slots=True)
class ToolDefinition:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema, member order as received
    custom: bool = False  # a free-form tool: served as a one-string function
    strict: bool = False
    input_examples: list[dict[str, Any]] | None = None  # Anthropic: example inputs shown

    def template_entry(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.schema()
        if self.strict:
            function["strict"] = True
        if self.input_examples:
            function["input_examples"] = self.input_examples
        return {"type": "function", "function": function}

    def schema(self) -> dict[str, Any]:
        if self.custom:
            return {
                "type": "object",
                "properties": {CUSTOM_TOOL_INPUT: {"type": "string"}},
                "required": [CUSTOM_TOOL_INPUT],
            }
        return (
            self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        )


@dataclass(slots=True)
class Conversation:
    messages: list[PromptMessage]
    options: TemplateOptions
    tools: list[ToolDefinition] = field(default_factory=list)
    callable_tools: set[str] | None = None  # names the decoder parses; None: no tool parsing
    add_generation_prompt: bool = True  # /tokenize may turn it off
    continue_final_message: bool = True  # a final assistant message is a prefill
    # Breakpoint marks taken out of the contents (prompt.cache_marks), kept for a re-render.
    cache_marks: list[tuple[int, int, int]] | None = None


@dataclass(slots=True)
class RenderedPrompt:
    text: str  # the prompt as text (control-token spellings from the request restored)
    ids: list[int]
    is_prefill: bool
    options: ResolvedOptions
    decoder: DecoderConfig
    # (breakpoint mark number, prompt tokens before it): exact frontiers only, prompt order.
    cache_marks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def thinking_on(self) -> bool:
        return self.decoder.thinking is not ThinkingStart.CLOSED


def render_conversation(served: ServedModel, conversation: Conversation) -> RenderedPrompt:
    if not conversation.messages:
        raise invalid("`messages` must contain at least one message", "messages")
    try:
        options = resolve_template_options(
            conversation.options, served.template_defaults, served.effort_ladder
        )
    except TemplateOptionError as exc:
        raise ApiError(400, str(exc), code=exc.code, param=exc.param) from exc
    if conversation.cache_marks is None:
        conversation.cache_marks = take_marks(conversation.messages)
    last = conversation.messages[-1]
    is_prefill = conversation.continue_final_message and last.role == "assistant"
    if is_prefill:
        _check_prefill(last, options, served.markup.reasoning)
    literal = LiteralText(served.engine.tokenizer, special_spellings(served.engine.tokenizer))
    rendered = _render(served, conversation, conversation.messages, options, literal, is_prefill)
    text = literal.restore(rendered)
    ids = literal.encode(rendered)
    marks: list[tuple[int, int]] = []
    if conversation.cache_marks:
        try:
            marked = _render(
                served, conversation, _marked(conversation), options, literal, is_prefill
            )
        except ApiError:  # the marks broke the template: they are only hints
            marked = ""
        marks = frontiers(marked, rendered, ids, literal.encode) if marked else []
    return RenderedPrompt(
        text,
        ids,
        is_prefill,
        options,
        _decoder_config(served, conversation, options, text),
        marks,
    )


def _marked(conversation: Conversation) -> list[PromptMessage]:
    """The messages with their breakpoint marks put back (copies)."""
    by_message: dict[int, list[tuple[int, int]]] = {}
    for index, offset, n in conversation.cache_marks or ():
        by_message.setdefault(index, []).append((offset, n))
    return [
        dataclasses.replace(m, content=with_marks(m.content, by_message[i]))
        if i in by_message
        else m
        for i, m in enumerate(conversation.messages)
    ]


def _render(
    served: ServedModel,
    conversation: Conversation,
    prompt_messages: list[PromptMessage],
    options: ResolvedOptions,
    literal: LiteralText,
    is_prefill: bool,
) -> str:
    last = prompt_messages[-1]
    messages = [_template_message(m, literal) for m in prompt_messages]
    kwargs = {
        k: literal.protect_tree(v, rendered_as_json=False)
        for k, v in options.template_kwargs.items()
    }
    tools = [
        literal.protect_tree(t.template_entry(), rendered_as_json=True) for t in conversation.tools
    ]
    if is_prefill:
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + _PREFILL_SENTINEL}
    try:
        rendered = served.template.render(
            messages,
            add_generation_prompt=conversation.add_generation_prompt and not is_prefill,
            template_kwargs={**kwargs, **({"tools": tools} if tools else {})},
        )
    except TemplateError as exc:
        raise ApiError(400, str(exc), code="invalid_prompt", param="messages") from exc
    if is_prefill:
        cut = rendered.find(_PREFILL_SENTINEL)
        if cut < 0:
            raise ApiError(
                400,
                "the chat template drops the final assistant message, so it cannot be continued",
                code="invalid_prompt",
                param=last.param,
            )
        rendered = rendered[:cut]
    return rendered


def _check_prefill(message: PromptMessage, options: ResolvedOptions, reasoning: bool) -> None:
    if message.has_media:
        raise ApiError(
            400,
            "a final assistant message is continued in place and cannot carry media",
            code="invalid_prompt",
            param=message.param,
        )
    if reasoning and not options.thinking_disabled:  # templates without thinking: no opener
        raise ApiError(
            400,
            "a final assistant message is continued in place, which needs thinking explicitly "
            'disabled (enable_thinking: false or reasoning_effort: "none"): a reasoning '
            "opener cannot be continued",
            code="invalid_prompt",
            param=message.param,
        )


def _template_message(message: PromptMessage, literal: LiteralText) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    content, reasoning = message.content, message.reasoning
    if role == "assistant" and reasoning is None and _THINK_CLOSE in content:
        # Inline reasoning history, split the way the Qwen templates split it, so that the
        # markers become the template's own and the rest is protected as text.
        head, _, content = content.partition(_THINK_CLOSE)
        reasoning = head.split(_THINK_OPEN)[-1]
        content = content.lstrip("\n")
    result: dict[str, Any] = {"role": role, "content": literal.protect(content)}
    if role == "assistant":
        if reasoning is not None:
            result["reasoning_content"] = literal.protect(reasoning)
        if message.tool_calls:
            result["tool_calls"] = [
                {
                    **({"id": call.id} if call.id is not None else {}),
                    "type": "function",
                    "function": {
                        "name": literal.protect(call.name),
                        "arguments": _protect_arguments(call.arguments, literal),
                    },
                }
                for call in message.tool_calls
            ]
    if role == "tool" and message.tool_call_id is not None:
        result["tool_call_id"] = message.tool_call_id
    return result


def _protect_arguments(arguments: Any, literal: LiteralText) -> Any:
    if not isinstance(arguments, dict):
        return literal.protect(arguments) if isinstance(arguments, str) else arguments
    # String values print raw; other values print through tojson.
    return {
        key: literal.protect(value)
        if isinstance(value, str)
        else literal.protect_tree(value, rendered_as_json=True)
        for key, value in arguments.items()
    }


def _decoder_config(
    served: ServedModel, conversation: Conversation, options: ResolvedOptions, prompt: str
) -> DecoderConfig:
    markup = served.markup
    if not markup.reasoning:
        thinking = ThinkingStart.CLOSED
    elif ThinkingStart.after_prompt(prompt) is ThinkingStart.OPEN:
        thinking = ThinkingStart.OPEN
    elif options.thinking_disabled or prompt.rstrip().endswith(_THINK_CLOSE):
        thinking = ThinkingStart.CLOSED
    else:
        thinking = ThinkingStart.MODEL
    tools = None
    if markup.tool_calls and conversation.callable_tools is not None:
        tools = {
            t.name: t.schema() for t in conversation.tools if t.name in conversation.callable_tools
        }
    return DecoderConfig(
        thinking=thinking,
        tools=tools,
        tolerant_tool_calls=served.tolerant_tool_calls,
        think_end_token_id=markup.think_end_token_id,
    )
