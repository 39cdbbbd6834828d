"""Validation and lowering of a Responses request to one Conversation and GenerationRequest.

Create and input-token counting share `prepare_prompt`: parent lookup, Item normalization,
tool parsing, template options and rendering are one path, so a count is the prompt that
create would send. Instructions become a leading developer turn for this request only
(they are never stored into the continuation history).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.prompt.template_options import TemplateOptions
from ninfer.protocols.cache_hints import cache_candidates
from ninfer.protocols.constraints import (
    GrammarSpec,
    check_tool_constraints,
    parse_response_format,
    parse_structured_outputs,
    plan_turn_constraint,
    single_output_constraint,
)
from ninfer.protocols.conversation import (
    Conversation,
    PromptMessage,
    RenderedPrompt,
    render_conversation,
)
from ninfer.protocols.openai_chat.lowering import check_model
from ninfer.protocols.openai_responses.items import lower_items, normalize_input
from ninfer.protocols.openai_responses.protocol import CreateRequest, PromptFields
from ninfer.protocols.openai_responses.store import ResponseStore, StoredResponse
from ninfer.protocols.openai_responses.tools import (
    ResponseTools,
    callable_tools,
    parse_tools,
    tool_policy,
)
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.thinking_budget import plan_thinking_budget
from ninfer.server.errors import ApiError, context_length_exceeded, invalid, unsupported

ENCRYPTED_REASONING = "reasoning.encrypted_content"
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


@dataclass(slots=True)
class PreparedPrompt:
    prompt: RenderedPrompt
    tools: ResponseTools
    input_items: list[dict[str, Any]]  # canonical Items of this request's `input`
    history: list[dict[str, Any]]  # the parent's history (empty for a root)
    preserve_thinking: bool | None  # explicit or inherited; what a child inherits
    conversation: Conversation | None = None


@dataclass(slots=True)
class LoweredResponse:
    request: CreateRequest
    prepared: PreparedPrompt
    generation: GenerationRequest
    stream: bool
    store: bool
    summary: str | None  # reasoning.summary as requested; a string asks for the placeholder
    include_encrypted: bool
    constraint: GrammarSpec | None = None  # compiled into generation.constraint before submit

    @property
    def prompt(self) -> RenderedPrompt:
        return self.prepared.prompt

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.prompt.ids)


def prepare_prompt(
    request: PromptFields, served: ServedModel, store: ResponseStore, request_id: str = "-"
) -> PreparedPrompt:
    if request.model is not None:
        check_model(request.model, served.public_id)
    _check_prompt_options(request)
    parent = _parent(request.previous_response_id, store)
    if request.input is None and parent is None:
        raise ApiError(
            400,
            "missing required parameter `input`",
            code="missing_required_parameter",
            param="input",
        )
    if not request.input and parent is None:
        raise invalid("`input` must not be empty without `previous_response_id`", "input")
    input_items = normalize_input(request.input)
    tools = parse_tools(request.tools, request_id)
    history = list(parent.history) if parent is not None else []
    entries = [(item, "previous_response_id") for item in history]
    entries += [(item, f"input[{i}]") for i, item in enumerate(input_items)]
    messages = lower_items(entries, tools)
    if request.instructions:
        messages.insert(
            0, PromptMessage(role="developer", content=request.instructions, param="instructions")
        )
    if not messages:
        raise invalid("the request has no Items to render", "input")
    preserve = _preserve_thinking(request, parent)
    reasoning = request.reasoning
    conversation = Conversation(
        messages=messages,
        options=TemplateOptions(
            # an explicit value, else the parent's (a kwarg is an explicit value too)
            preserve_thinking=request.preserve_thinking
            if request.preserve_thinking is not None or _kwarg_preserve(request)
            else preserve,
            reasoning_effort=reasoning.effort if reasoning is not None else None,
            kwargs=request.chat_template_kwargs,
            typed_fields={
                "preserve_thinking": "preserve_thinking",
                "reasoning_effort": "reasoning.effort",
            },
        ),
        tools=tools.definitions,
        callable_tools=callable_tools(request.tool_choice, tools),
        continue_final_message=False,  # Responses always opens a new assistant turn
    )
    try:
        prompt = render_conversation(served, conversation)
    except ApiError as exc:
        if exc.param == "messages":
            exc.param = "input"
        raise
    return PreparedPrompt(prompt, tools, input_items, history, preserve, conversation)


def lower_create(
    request: CreateRequest, served: ServedModel, store: ResponseStore, request_id: str = "-"
) -> LoweredResponse:
    if request.model is None:
        raise ApiError(
            400,
            "missing required parameter `model`",
            code="missing_required_parameter",
            param="model",
        )
    _check_create_options(request)
    prepared = prepare_prompt(request, served, store, request_id)
    prompt = prepared.prompt
    max_tokens = _max_tokens(request.max_output_tokens, len(prompt.ids), served)
    generation = GenerationRequest(
        prompt_ids=prompt.ids,
        max_tokens=max_tokens,
        sampling=served.sampling.resolve(
            request.sampling_fields(), request.seed, thinking=prompt.thinking_on
        ),
        thinking_budget=plan_thinking_budget(
            served.thinking_close,
            prompt.decoder.thinking,
            served.default_thinking_budget,
            max_tokens,
            "max_output_tokens",
        ),
        cache_candidates=cache_candidates(
            prompt.ids,
            served.engine.tokenizer,
            (request.prompt_cache_options and request.prompt_cache_options.mode) or "implicit",
            prompt.cache_marks,
        ),
    )
    reasoning = request.reasoning
    summary = None
    if reasoning is not None:
        summary = reasoning.summary if reasoning.summary is not None else reasoning.generate_summary
    return LoweredResponse(
        request=request,
        prepared=prepared,
        generation=generation,
        stream=bool(request.stream),
        store=request.store is not False,
        summary=summary,
        include_encrypted=ENCRYPTED_REASONING in (request.include or []),
        constraint=_constraint(request, prepared, generation, served),
    )


def _constraint(
    request: CreateRequest,
    prepared: PreparedPrompt,
    generation: GenerationRequest,
    served: ServedModel,
) -> GrammarSpec | None:
    """text.format / structured_outputs and tool_choice through the shared lowering."""
    mode = check_tool_constraints(request.tool_constraints)
    text_format = request.text.format if request.text is not None else None
    output = single_output_constraint(
        parse_response_format(text_format, "text.format", nested=False),
        parse_structured_outputs(request.structured_outputs),
    )
    tools = prepared.tools
    policy = None
    if tools.definitions:
        policy = tool_policy(request.tool_choice, request.parallel_tool_calls, mode, tools)
    assert prepared.conversation is not None
    return plan_turn_constraint(
        output,
        policy,
        generation,
        prepared.prompt,
        prepared.conversation,
        served.engine.tokenizer,
        thinking_param="reasoning.effort",
    )


def _parent(response_id: str | None, store: ResponseStore) -> StoredResponse | None:
    if response_id is None:
        return None
    parent = store.get(response_id)
    if parent is None:
        shown = response_id.encode("ascii", "backslashreplace").decode()[:80]
        raise ApiError(
            400,
            f"previous response `{shown}` is not stored here (it was never stored, was "
            "created with store: false, was deleted, or was evicted from the local store)",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    return parent


def _preserve_thinking(request: PromptFields, parent: StoredResponse | None) -> bool | None:
    if request.preserve_thinking is not None:
        return request.preserve_thinking
    kwarg = (request.chat_template_kwargs or {}).get("preserve_thinking")
    if kwarg is not None:
        return kwarg if isinstance(kwarg, bool) else None  # a non-boolean fails in resolution
    return parent.preserve_thinking if parent is not None else None


def _kwarg_preserve(request: PromptFields) -> bool:
    return (request.chat_template_kwargs or {}).get("preserve_thinking") is not None


def _check_prompt_options(request: PromptFields) -> None:
    if request.conversation is not None:
        raise unsupported(
            "conversation", "Conversations are not served; continue with previous_response_id"
        )
    text = request.text
    if text is not None:
        fmt = text.format
        if fmt is not None:
            kind = fmt.get("type")
            if kind not in ("text", "json_object", "json_schema"):
                raise invalid(
                    "`text.format.type` must be text, json_object or json_schema, not "
                    f"`{_show(str(kind))}`",
                    "text.format.type",
                )
        if text.verbosity not in (None, "medium"):
            raise unsupported(
                "text.verbosity",
                f"`{_show(text.verbosity)}` asked; verbosity cannot be steered (only medium)",
            )
    if request.truncation not in (None, "disabled"):
        if request.truncation == "auto":
            raise unsupported(
                "truncation", "Items are never dropped; an overlong input fails instead"
            )
        raise invalid(
            f"`truncation` must be `disabled` or `auto`, not `{_show(request.truncation)}`",
            "truncation",
        )


def _check_create_options(request: CreateRequest) -> None:
    for name, what in (
        ("prompt", "stored prompt templates are not served"),
        ("context_management", "server-side context management is not available"),
    ):
        if getattr(request, name) is not None:
            raise unsupported(name, what)
    if request.background:
        raise unsupported("background", "background execution is not available")
    if request.service_tier not in (None, "auto", "default"):
        raise unsupported(
            "service_tier",
            f"`{_show(request.service_tier)}` asked; there is one service tier here (`default`)",
        )
    if request.top_logprobs not in (None, 0):
        raise unsupported(
            "top_logprobs",
            f"{request.top_logprobs} asked; log probabilities are not reported by this build",
        )
    for i, value in enumerate(request.include or []):
        if value != ENCRYPTED_REASONING:
            raise unsupported(
                f"include[{i}]",
                f"`{_show(value)}` cannot be included; only `{ENCRYPTED_REASONING}` is available",
            )
    if request.stream_options is not None and not request.stream:
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    options = request.prompt_cache_options
    if options is not None and options.mode not in (None, "implicit", "explicit"):
        raise invalid("`mode` must be `implicit` or `explicit`", "prompt_cache_options.mode")
    if request.prompt_cache_retention not in (None, "in_memory", "24h"):
        raise invalid(
            "`prompt_cache_retention` must be `in_memory` or `24h`", "prompt_cache_retention"
        )
    _check_metadata(request.metadata)


def _check_metadata(metadata: dict[str, Any] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid(
            f"`metadata` has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS} are allowed",
            "metadata",
        )
    for key, value in metadata.items():
        shown = key.encode("ascii", "backslashreplace").decode()[:64]
        if not isinstance(value, str):
            raise invalid(
                f"metadata value of `{shown}` must be a string", f"metadata.{key}", "invalid_type"
            )
        if len(key) > MAX_METADATA_KEY:
            raise invalid(
                f"metadata key `{shown}...` has {len(key)} characters; at most "
                f"{MAX_METADATA_KEY} are allowed",
                "metadata",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise invalid(
                f"metadata value of `{shown}` has {len(value)} characters; at most "
                f"{MAX_METADATA_VALUE} are allowed",
                f"metadata.{key}",
            )


def _max_tokens(asked: int | None, prompt_tokens: int, served: ServedModel) -> int:
    ceiling = served.max_context
    if prompt_tokens + (0 if asked == 0 else 1) > ceiling:
        raise context_length_exceeded(prompt_tokens, ceiling, param="input")
    room = ceiling - prompt_tokens
    return served.cap_output(min(served.default_max_tokens if asked is None else asked, room))


def _show(value: str, limit: int = 64) -> str:
    """A client value for an error message: ASCII-escaped and truncated."""
    text = str(value).encode("ascii", "backslashreplace").decode()
    return text if len(text) <= limit else text[:limit] + "..."
