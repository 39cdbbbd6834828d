"""Validation and lowering of a Chat Completions request to one GenerationRequest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.prompt import TemplateError
from ninfer.prompt.literal_text import encode_rendered_prompt
from ninfer.protocols.openai_chat.protocol import ChatCompletionRequest, ContentPart, Message
from ninfer.protocols.served_model import ServedModel
from ninfer.server.errors import ApiError, context_length_exceeded, invalid, unsupported

MAX_STOP_STRINGS = 4
_TEMPLATE_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
# Keys a client may not override through chat_template_kwargs: the server supplies them.
_RESERVED_TEMPLATE_KEYS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
# Marks where a final assistant message's content ends, so generation continues in place.
_PREFILL_SENTINEL = "\uffff\u2063ninfer-prefill-end\u2063\uffff"


@dataclass(slots=True)
class LoweredChat:
    generation: GenerationRequest
    prompt_tokens: int
    stream: bool
    include_usage: bool


def lower_chat_request(request: ChatCompletionRequest, served: ServedModel) -> LoweredChat:
    check_model(request.model, served.public_id)
    _reject_unsupported(request)
    messages, is_prefill = _template_messages(request.messages)
    prompt_text = _render_prompt(messages, is_prefill, _template_kwargs(request, served), served)
    prompt_ids = encode_rendered_prompt(
        served.engine.tokenizer, prompt_text, [m["content"] for m in messages]
    )
    generation = GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=_max_tokens(request, len(prompt_ids), served),
        sampling=served.sampling.resolve(
            {
                "temperature": request.temperature,
                "top_p": request.top_p,
                "top_k": request.top_k,
                "min_p": request.min_p,
                "presence_penalty": request.presence_penalty,
                "frequency_penalty": request.frequency_penalty,
            },
            request.seed,
        ),
        stop_strings=_stop_strings(request.stop),
    )
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    if request.stream_options is not None and not request.stream:
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    return LoweredChat(generation, len(prompt_ids), bool(request.stream), include_usage)


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
        raise unsupported("logit_bias", "logit biases are not applied by this build")
    if request.repetition_penalty not in (None, 1, 1.0):
        raise unsupported("repetition_penalty", "only the neutral value 1 is accepted")
    if request.response_format is not None and request.response_format.get("type") != "text":
        raise unsupported(
            "response_format", "JSON mode and JSON Schema are not available in this build"
        )
    if request.structured_outputs is not None:
        raise unsupported("structured_outputs", "constrained output is not available in this build")
    if request.modalities is not None and request.modalities not in (["text"], []):
        raise unsupported("modalities", "only text output is available")
    if request.audio is not None:
        raise unsupported("audio", "audio output is not available")
    if request.tools:
        raise unsupported("tools", "tool calling is not available in this build")
    if request.functions:
        raise unsupported("functions", "legacy function calling is not available in this build")
    if request.function_call not in (None, "none", "auto"):
        raise unsupported("function_call", "legacy function calling is not available in this build")
    if request.verbosity not in (None, "medium"):
        raise unsupported("verbosity", "only the default (medium) verbosity is available")
    if request.web_search_options is not None:
        raise unsupported("web_search_options", "web search is not available")
    if request.tool_choice not in (None, "none", "auto"):
        raise unsupported("tool_choice", "tool calling is not available in this build")
    if request.store:
        raise unsupported("store", "stored Chat Completions are not available")
    if request.timings_per_token:
        raise unsupported("timings_per_token", "per-token timings are not available in this build")
    if request.return_progress:
        raise unsupported(
            "return_progress", "prompt progress events are not available in this build"
        )


def _template_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], bool]:
    if not messages:
        raise invalid("`messages` must contain at least one message", "messages")
    rendered = [_template_message(i, m) for i, m in enumerate(messages)]
    return rendered, messages[-1].role == "assistant"


def _template_message(index: int, message: Message) -> dict[str, Any]:
    where = f"messages[{index}]"
    if message.role in ("tool", "function"):
        raise unsupported(
            f"{where}.role", "tool history needs tool calling, not available in this build"
        )
    role = _TEMPLATE_ROLES.get(message.role)
    if role is None:
        raise invalid(
            f"unknown role `{message.role}`; expected system, developer, user or assistant",
            f"{where}.role",
        )
    if message.tool_calls or message.function_call is not None:
        raise unsupported(f"{where}.tool_calls", "tool calling is not available in this build")
    if message.name:
        raise unsupported(
            f"{where}.name", "participant names cannot be represented by the chat template"
        )
    if message.content is None and role != "assistant":
        raise invalid(f"a {message.role} message needs `content`", f"{where}.content")
    result: dict[str, Any] = {"role": role, "content": _content_text(where, role, message.content)}
    if role == "assistant" and message.reasoning_content is not None:
        result["reasoning_content"] = message.reasoning_content
    return result


def _content_text(where: str, role: str, content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if part.type == "text":
            if part.text is None:
                raise invalid("a text part needs a `text` string", f"{param}.text")
            pieces.append(part.text)
        elif part.type == "refusal" and role == "assistant":
            if part.refusal is None:
                raise invalid("a refusal part needs a `refusal` string", f"{param}.refusal")
            pieces.append(part.refusal)
        elif part.type in ("image_url", "video_url", "input_audio", "file"):
            raise unsupported(
                f"{param}.type", f"`{part.type}` input is not available in this build"
            )
        else:
            raise invalid(f"unknown content part type `{part.type}`", f"{param}.type")
    return "".join(pieces)


def _template_kwargs(request: ChatCompletionRequest, served: ServedModel) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(served.template_defaults)
    extra = request.chat_template_kwargs or {}
    for key in extra:
        if key in _RESERVED_TEMPLATE_KEYS:
            raise invalid(
                f"`{key}` is supplied by the server and cannot be overridden",
                f"chat_template_kwargs.{key}",
            )
    typed = {
        "enable_thinking": request.enable_thinking,
        "preserve_thinking": request.preserve_thinking,
        "reasoning_effort": request.reasoning_effort,
    }
    if request.reasoning_effort == "none":
        if request.enable_thinking is True or extra.get("enable_thinking") is True:
            raise invalid(
                "reasoning_effort `none` conflicts with enable_thinking true",
                "reasoning_effort",
                code="conflicting_template_option",
            )
        typed["enable_thinking"] = False
    for key, value in typed.items():
        if value is not None and key in extra and extra[key] is not None and extra[key] != value:
            raise invalid(
                f"`{key}` differs between the top level and chat_template_kwargs",
                f"chat_template_kwargs.{key}",
                code="conflicting_template_option",
            )
    kwargs.update({k: v for k, v in extra.items() if v is not None})
    kwargs.update({k: v for k, v in typed.items() if v is not None})
    return kwargs


def _render_prompt(
    messages: list[dict[str, Any]], is_prefill: bool, kwargs: dict[str, Any], served: ServedModel
) -> str:
    try:
        if not is_prefill:
            return served.template.render(
                messages, add_generation_prompt=True, template_kwargs=kwargs
            )
        # Continue the final assistant turn in place: render it with an end marker on its
        # content and cut the prompt there, dropping the template's turn-closing tokens.
        marked = [
            *messages[:-1],
            {**messages[-1], "content": messages[-1]["content"] + _PREFILL_SENTINEL},
        ]
        text = served.template.render(marked, add_generation_prompt=False, template_kwargs=kwargs)
    except TemplateError as exc:
        raise ApiError(400, str(exc), code="invalid_prompt", param="messages") from exc
    cut = text.find(_PREFILL_SENTINEL)
    if cut < 0:
        raise ApiError(
            400,
            "the chat template drops the final assistant message, so it cannot be continued",
            code="invalid_prompt",
            param=f"messages[{len(messages) - 1}]",
        )
    return text[:cut]


def _max_tokens(request: ChatCompletionRequest, prompt_tokens: int, served: ServedModel) -> int:
    ceiling = served.max_context
    asked = request.max_completion_tokens
    if asked is None:
        asked = request.max_tokens
    needed = prompt_tokens + (0 if asked == 0 else 1)
    if needed > ceiling:
        raise context_length_exceeded(prompt_tokens, ceiling)
    room = ceiling - prompt_tokens
    return min(served.default_max_tokens if asked is None else asked, room)


def _stop_strings(stop: str | list[str] | None) -> list[str]:
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
