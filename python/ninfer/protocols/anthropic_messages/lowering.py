"""Validation and lowering of a Messages request to one Conversation and GenerationRequest.

count_tokens and Messages share `messages_conversation` (normalization, tools, thinking mode,
prefill, cache markers); only Messages adds the output-side fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.prompt.template_options import TemplateOptions
from ninfer.protocols.anthropic_messages.cache_control import CacheBreakpoints
from ninfer.protocols.anthropic_messages.history import lower_history, lower_system
from ninfer.protocols.anthropic_messages.protocol import MessagesRequest
from ninfer.protocols.anthropic_messages.tools import (
    ToolSelection,
    parse_tools,
    select_tools,
    tool_policy,
)
from ninfer.protocols.constraints import (
    GrammarSpec,
    OutputConstraint,
    check_tool_constraints,
    parse_response_format,
    parse_structured_outputs,
    plan_turn_constraint,
    single_output_constraint,
)
from ninfer.protocols.conversation import (
    Conversation,
    RenderedPrompt,
    ToolDefinition,
    render_conversation,
)
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.thinking_budget import plan_thinking_budget
from ninfer.server.errors import ApiError, context_length_exceeded, invalid, unsupported

MIN_THINKING_BUDGET = 1024
_THINKING_TYPES = ("disabled", "adaptive", "enabled")
_DISPLAYS = ("summarized", "omitted")
_EFFORTS = ("low", "medium", "high", "xhigh", "max")


@dataclass(slots=True)
class ThinkingRequest:
    enabled: bool | None  # None: the server's / template's default
    budget: int | None
    omitted: bool  # thinking.display "omitted": signatures only, no thinking text


@dataclass(slots=True)
class MessagesConversation:
    conversation: Conversation
    thinking: ThinkingRequest
    tools: ToolSelection
    cache: CacheBreakpoints


@dataclass(slots=True)
class LoweredMessages:
    generation: GenerationRequest
    prompt: RenderedPrompt
    model: str  # the client's label, echoed
    stream: bool
    thinking: ThinkingRequest
    tools: list[ToolDefinition]
    single_call: bool
    room: int  # output tokens the context ceiling leaves
    asked_tokens: int
    constraint: GrammarSpec | None = None  # compiled into generation.constraint before submit

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.ids)


def parse_thinking(thinking: dict[str, Any] | None) -> ThinkingRequest:
    if thinking is None:
        return ThinkingRequest(None, None, False)
    kind = thinking.get("type")
    if kind not in _THINKING_TYPES:
        raise invalid(
            f"thinking type must be one of {', '.join(_THINKING_TYPES)}, got {kind!r}",
            "thinking.type",
        )
    display = thinking.get("display")
    if display is not None and display not in _DISPLAYS:
        raise invalid(
            f"thinking display must be `summarized` or `omitted`, got {display!r}",
            "thinking.display",
        )
    budget = None
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise invalid(
                "enabled thinking needs an integer `budget_tokens`", "thinking.budget_tokens"
            )
        if budget < MIN_THINKING_BUDGET:
            raise invalid(
                f"thinking budget_tokens must be at least {MIN_THINKING_BUDGET}, got {budget}",
                "thinking.budget_tokens",
            )
    return ThinkingRequest(kind != "disabled", budget, display == "omitted")


def _effort(output_config: dict[str, Any] | None, thinking: ThinkingRequest) -> str | None:
    if output_config is None:
        return None
    effort = output_config.get("effort")
    if effort is not None and effort not in _EFFORTS:
        raise invalid(
            f"effort must be one of {', '.join(_EFFORTS)}, got {effort!r}", "output_config.effort"
        )
    # Effort steers thinking depth; with thinking off there is nothing for it to steer.
    return None if thinking.enabled is False else effort


def _reject_unsupported(request: MessagesRequest) -> None:
    if request.container is not None:
        raise unsupported("container", "code-execution containers are not available")
    if request.mcp_servers:
        raise unsupported("mcp_servers", "remote MCP servers need an MCP client")


def messages_conversation(request: MessagesRequest) -> MessagesConversation:
    """The prompt side of a request (shared with count_tokens)."""
    if not request.model:
        raise invalid("`model` must be a non-empty string", "model")
    _reject_unsupported(request)
    cache = CacheBreakpoints()
    thinking = parse_thinking(request.thinking)
    tools = parse_tools(request.tools, cache)
    selection = select_tools(request.tool_choice, tools)
    messages = lower_system(request.system, cache) + lower_history(request.messages, cache)
    cache.request_level(request.cache_control)
    options = TemplateOptions(
        enable_thinking=thinking.enabled,
        preserve_thinking=request.preserve_thinking,
        reasoning_effort=_effort(request.output_config, thinking),
        kwargs=request.chat_template_kwargs,
        typed_fields={
            "enable_thinking": "thinking.type",
            "preserve_thinking": "preserve_thinking",
            "reasoning_effort": "output_config.effort",
        },
    )
    conversation = Conversation(
        messages=messages, options=options, tools=tools, callable_tools=selection.callable
    )
    return MessagesConversation(conversation, thinking, selection, cache)


def render_messages(served: ServedModel, lowered: MessagesConversation) -> RenderedPrompt:
    last = lowered.conversation.messages[-1]
    # An explicit request for thinking gets the protocol's wording; an unset one is judged by
    # the prompt path against the server's defaults (--no-thinking allows a prefill).
    if last.role == "assistant" and served.markup.reasoning and lowered.thinking.enabled:
        raise ApiError(
            400,
            "a final assistant message is a prefill that generation continues in place, which "
            'needs `thinking: {"type": "disabled"}`: a thinking block cannot be continued',
            code="invalid_prompt",
            param=last.param,
        )
    return render_conversation(served, lowered.conversation)


def lower_messages_request(request: MessagesRequest, served: ServedModel) -> LoweredMessages:
    lowered = messages_conversation(request)
    asked = request.max_tokens if request.max_tokens is not None else served.default_max_tokens
    if asked < 1:
        raise invalid(f"max_tokens must be at least 1, got {asked}", "max_tokens")
    stops = _stop_sequences(request.stop_sequences)
    prompt = render_messages(served, lowered)
    prompt_tokens = len(prompt.ids)
    if prompt_tokens + 1 > served.max_context:
        raise context_length_exceeded(prompt_tokens, served.max_context)
    room = served.max_context - prompt_tokens
    max_tokens = served.cap_output(min(asked, room))
    thinking = lowered.thinking
    limit = thinking.budget if thinking.budget is not None else served.default_thinking_budget
    budget_param = "thinking.budget_tokens" if thinking.budget is not None else "max_tokens"
    generation = GenerationRequest(
        prompt_ids=prompt.ids,
        max_tokens=max_tokens,
        sampling=served.sampling.resolve(
            {"temperature": request.temperature, "top_p": request.top_p, "top_k": request.top_k},
            None,
            thinking=prompt.thinking_on,
        ),
        stop_strings=stops,
        cache_candidates=lowered.cache.candidates(prompt.cache_marks),
        thinking_budget=plan_thinking_budget(
            served.thinking_close, prompt.decoder.thinking, limit, max_tokens, budget_param
        ),
    )
    return LoweredMessages(
        generation=generation,
        prompt=prompt,
        model=request.model,
        stream=bool(request.stream),
        thinking=thinking,
        tools=lowered.conversation.tools,
        single_call=lowered.tools.single_call,
        room=room,
        asked_tokens=asked,
        constraint=_constraint(request, lowered, generation, prompt, served),
    )


def _constraint(
    request: MessagesRequest,
    lowered: MessagesConversation,
    generation: GenerationRequest,
    prompt: RenderedPrompt,
    served: ServedModel,
) -> GrammarSpec | None:
    """output_config.format / structured_outputs and tool_choice through the shared lowering."""
    mode = check_tool_constraints(request.tool_constraints)
    output = single_output_constraint(
        _output_format(request.output_config), parse_structured_outputs(request.structured_outputs)
    )
    tools = lowered.conversation.tools
    policy = tool_policy(request.tool_choice, tools, mode) if tools else None
    return plan_turn_constraint(
        output,
        policy,
        generation,
        prompt,
        lowered.conversation,
        served.engine.tokenizer,
        stop_param="stop_sequences",
        thinking_param="thinking.type",
    )


def _output_format(output_config: dict[str, Any] | None) -> OutputConstraint | None:
    """output_config.format: Messages knows one format, `json_schema` with a flat `schema`."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("`format` must be an object", "output_config.format", "invalid_type")
    if fmt.get("type") != "json_schema":
        shown = str(fmt.get("type")).encode("ascii", "backslashreplace").decode()[:64]
        raise invalid(
            f"format type must be `json_schema`, got `{shown}`", "output_config.format.type"
        )
    return parse_response_format(fmt, "output_config.format", nested=False)


def _stop_sequences(stops: list[str] | None) -> list[str]:
    for i, stop in enumerate(stops or []):
        if not stop:
            raise invalid("stop sequences must not be empty", f"stop_sequences[{i}]")
    return list(stops or [])
