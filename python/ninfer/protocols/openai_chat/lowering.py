"""Validation and lowering of a Chat Completions request to one GenerationRequest."""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.engine_types import GenerationRequest
from ninfer.prompt.template_options import TemplateOptions
from ninfer.protocols.cache_hints import cache_candidates, cache_mode
from ninfer.protocols.constraints import (
    GrammarSpec,
    parse_response_format,
    parse_structured_outputs,
    single_output_constraint,
)
from ninfer.protocols.conversation import (
    Conversation,
    RenderedPrompt,
    ToolDefinition,
    render_conversation,
)
from ninfer.protocols.generation_fields import check_mm_processor_kwargs
from ninfer.protocols.openai_chat.constraints import chat_constraint
from ninfer.protocols.openai_chat.messages import lower_messages
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest
from ninfer.protocols.openai_chat.tools import callable_tools, parse_tools
from ninfer.protocols.served_model import ServedModel
from ninfer.protocols.thinking_budget import plan_thinking_budget
from ninfer.server.errors import ApiError, context_length_exceeded, invalid, unsupported

MAX_STOP_STRINGS = 4


@dataclass(slots=True)
class LoweredChat:
    generation: GenerationRequest
    prompt: RenderedPrompt
    stream: bool
    include_usage: bool
    timings_per_token: bool = False
    return_progress: bool = False
    return_token_ids: bool = False
    tools: list[ToolDefinition] = field(default_factory=list)
    constraint: GrammarSpec | None = None  # compiled into generation.constraint before submit

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt.ids)


def chat_conversation(request: ChatCompletionRequest) -> Conversation:
    """The prompt-side part of a request (shared with /tokenize's chat form)."""
    tools = parse_tools(request.tools)
    return Conversation(
        messages=lower_messages(request.messages),
        options=TemplateOptions(
            enable_thinking=request.enable_thinking,
            preserve_thinking=request.preserve_thinking,
            reasoning_effort=request.reasoning_effort,
            kwargs=request.chat_template_kwargs,
            typed_fields={
                "enable_thinking": "enable_thinking",
                "preserve_thinking": "preserve_thinking",
                "reasoning_effort": "reasoning_effort",
            },
        ),
        tools=tools,
        callable_tools=callable_tools(request.tool_choice, tools),
    )


def lower_chat_request(request: ChatCompletionRequest, served: ServedModel) -> LoweredChat:
    check_model(request.model, served.public_id)
    _reject_unsupported(request)
    if request.stream_options is not None and not request.stream:
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    conversation = chat_conversation(request)
    prompt = render_conversation(served, conversation)
    max_tokens = _max_tokens(request, len(prompt.ids), served)
    generation = GenerationRequest(
        prompt_ids=prompt.ids,
        max_tokens=max_tokens,
        sampling=served.sampling.resolve(
            request.sampling_fields(),
            request.seed,
            thinking=prompt.thinking_on,
        ),
        stop_strings=stop_strings(request.stop),
        stop_token_ids=stop_token_ids(request.stop_token_ids, served),
        ignore_eos=bool(request.ignore_eos),
        min_tokens=request.min_tokens or 0,
        cache_candidates=cache_candidates(
            prompt.ids,
            served.engine.tokenizer,
            cache_mode(request.prompt_cache_options),
            prompt.cache_marks,
        ),
        thinking_budget=plan_thinking_budget(
            served.thinking_close,
            prompt.decoder.thinking,
            served.default_thinking_budget,
            max_tokens,
            "max_completion_tokens",
        ),
        report_progress=bool(request.stream and request.return_progress),
    )
    output = single_output_constraint(
        parse_response_format(request.response_format, "response_format", nested=True),
        parse_structured_outputs(request.structured_outputs),
    )
    constraint = chat_constraint(request, conversation, output, generation, served, prompt)
    stream = bool(request.stream)
    return LoweredChat(
        generation,
        prompt,
        stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        timings_per_token=stream and bool(request.timings_per_token),
        return_progress=stream and bool(request.return_progress),
        return_token_ids=bool(request.return_token_ids),
        tools=conversation.tools,
        constraint=constraint,
    )


def stop_token_ids(ids: list[int] | None, served: ServedModel) -> list[int]:
    vocab = int(served.engine.model_info.get("n_vocab") or 0)
    for i, token in enumerate(ids or []):
        if vocab and token >= vocab:
            raise invalid(
                f"token id {token} is outside the vocabulary (size {vocab})", f"stop_token_ids[{i}]"
            )
    return list(ids or [])


def check_model(model: str, public_id: str) -> None:
    if model != public_id:
        raise ApiError(
            400,
            f"model `{model}` is not served here; this server serves `{public_id}`",
            code="model_not_found",
            param="model",
        )


def _reject_unsupported(request: ChatCompletionRequest) -> None:
    if request.n not in (None, 1):
        raise unsupported("n", "this server generates exactly one choice per request (n: 1)")
    if request.logprobs:
        raise unsupported("logprobs", "log probabilities are not reported by this build")
    if request.top_logprobs:
        raise unsupported("top_logprobs", "log probabilities are not reported by this build")
    if request.logit_bias and any(v != 0 for v in request.logit_bias.values()):
        raise unsupported("logit_bias", "logit biases are not applied to the sampler")
    if request.repetition_penalty not in (None, 1, 1.0):
        raise unsupported("repetition_penalty", "only the neutral value 1 is accepted")
    # An `audio` configuration is inert while the output is text only (modalities absent or
    # ["text"]); asking for the audio modality is what requests audio output.
    if request.modalities is not None and any(m != "text" for m in request.modalities):
        raise unsupported("modalities", "only text output is produced (no audio output)")
    check_mm_processor_kwargs(request.mm_processor_kwargs)
    if request.functions:
        raise unsupported(
            "functions", "legacy function definitions are not served; declare `tools` instead"
        )
    if request.function_call not in (None, "none", "auto"):
        raise unsupported(
            "function_call", "legacy function selection is not served; use `tool_choice`"
        )
    if request.verbosity not in (None, "medium"):
        raise unsupported("verbosity", "output verbosity cannot be steered (only `medium`)")
    if request.web_search_options is not None:
        raise unsupported("web_search_options", "web search is not available")
    if request.store:
        raise unsupported("store", "completions are not stored by this server")


def _max_tokens(request: ChatCompletionRequest, prompt_tokens: int, served: ServedModel) -> int:
    ceiling = served.max_context
    asked = request.max_completion_tokens
    if asked is None:
        asked = request.max_tokens
    needed = prompt_tokens + (0 if asked == 0 else 1)
    if needed > ceiling:
        raise context_length_exceeded(prompt_tokens, ceiling)
    room = ceiling - prompt_tokens
    return served.cap_output(min(served.default_max_tokens if asked is None else asked, room))


def stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"at most {MAX_STOP_STRINGS} stop strings are allowed", "stop")
    for i, s in enumerate(stops):
        if not s:
            raise invalid(
                "stop strings must not be empty", "stop" if isinstance(stop, str) else f"stop[{i}]"
            )
    return list(stops)
