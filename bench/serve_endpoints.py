"""The streaming wire formats bench_serve.py drives, one small table entry per endpoint.

Each entry builds the request body of a one-turn prompt and reads one parsed SSE `data:`
payload into a `StreamUpdate`: the output text it carries (reasoning and answer alike, since
both are generated tokens), usage counts when it reports them, whether the stream is over,
and an error. Written against the public formats of OpenAI Chat Completions and legacy
Completions (`data: [DONE]` ends them), OpenAI Responses (`response.*` events) and Anthropic
Messages (`message_*` / `content_block_*` events).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    text: str = ""
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False
    error: str | None = None
    # The server's own account of the request (llama.cpp's `timings` object, which NInfer
    # also sends on the last chunk): engine prefill ms and ms per decoded token.
    server_prompt_ms: float | None = None
    server_decode_ms_per_token: float | None = None


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    model: str
    max_tokens: int
    ignore_eos: bool
    temperature: float | None


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    body: Callable[[str, GenerationOptions], dict[str, Any]]
    parse: Callable[[dict[str, Any]], StreamUpdate]
    headers: tuple[tuple[str, str], ...] = ()
    # Whether the format has the vLLM / llama.cpp `ignore_eos` extension. Responses and
    # Messages servers refuse (or ignore) fields outside their contract, so it is not sent.
    ignore_eos: bool = True


def _common(options: GenerationOptions, *, ignore_eos: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"model": options.model, "stream": True}
    if options.temperature is not None:
        out["temperature"] = options.temperature
    if ignore_eos and options.ignore_eos:
        out["ignore_eos"] = True  # run to the token budget
    return out


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


# --- OpenAI Chat Completions ------------------------------------------------------------


def _chat_body(prompt: str, options: GenerationOptions) -> dict[str, Any]:
    return {
        **_common(options),
        "messages": [{"role": "user", "content": prompt}],
        "max_completion_tokens": options.max_tokens,
        "max_tokens": options.max_tokens,  # for servers that only know the legacy name
        "stream_options": {"include_usage": True},
    }


def _usage_update(usage: Any, prompt_key: str, output_key: str) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    return usage.get(prompt_key), usage.get(output_key)


def _chat_parse(payload: dict[str, Any]) -> StreamUpdate:
    if "error" in payload:
        return StreamUpdate(error=_error_text(payload["error"]), done=True)
    text = ""
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        text += delta.get("reasoning_content") or delta.get("reasoning") or ""
        text += delta.get("content") or ""
        for call in delta.get("tool_calls") or ():
            text += (call.get("function") or {}).get("arguments") or ""
    prompt, output = _usage_update(payload.get("usage"), "prompt_tokens", "completion_tokens")
    prompt_ms, per_token_ms = _server_timings(payload.get("timings"))
    return StreamUpdate(
        text=text,
        output_tokens=output,
        prompt_tokens=prompt,
        server_prompt_ms=prompt_ms,
        server_decode_ms_per_token=per_token_ms,
    )


def _server_timings(timings: Any) -> tuple[float | None, float | None]:
    """(prompt_ms, predicted_per_token_ms) of a llama.cpp-style `timings` object; a field
    that is missing, not a number or zero (undefined) is None."""
    if not isinstance(timings, dict):
        return None, None

    def positive(key: str) -> float | None:
        value = timings.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return None
        return float(value)

    return positive("prompt_ms"), positive("predicted_per_token_ms")


# --- OpenAI legacy Completions ----------------------------------------------------------


def _completions_body(prompt: str, options: GenerationOptions) -> dict[str, Any]:
    return {
        **_common(options),
        "prompt": prompt,
        "max_tokens": options.max_tokens,
        "stream_options": {"include_usage": True},
    }


def _completions_parse(payload: dict[str, Any]) -> StreamUpdate:
    if "error" in payload:
        return StreamUpdate(error=_error_text(payload["error"]), done=True)
    text = "".join(choice.get("text") or "" for choice in payload.get("choices") or ())
    prompt, output = _usage_update(payload.get("usage"), "prompt_tokens", "completion_tokens")
    prompt_ms, per_token_ms = _server_timings(payload.get("timings"))
    return StreamUpdate(
        text=text,
        output_tokens=output,
        prompt_tokens=prompt,
        server_prompt_ms=prompt_ms,
        server_decode_ms_per_token=per_token_ms,
    )


# --- OpenAI Responses -------------------------------------------------------------------

_RESPONSES_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)
# (A reasoning summary's deltas are a placeholder, not generated tokens: not counted.)
# A stream ends with exactly one of these; `incomplete` is the normal end at the budget.
_RESPONSES_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


def _responses_body(prompt: str, options: GenerationOptions) -> dict[str, Any]:
    return {
        **_common(options, ignore_eos=False),
        "input": prompt,
        "max_output_tokens": options.max_tokens,
    }


def _responses_parse(payload: dict[str, Any]) -> StreamUpdate:
    kind = payload.get("type")
    if kind in _RESPONSES_TEXT_EVENTS:
        return StreamUpdate(text=payload.get("delta") or "")
    if kind in _RESPONSES_FINAL_EVENTS:
        usage = (payload.get("response") or {}).get("usage")
        prompt, output = _usage_update(usage, "input_tokens", "output_tokens")
        return StreamUpdate(output_tokens=output, prompt_tokens=prompt, done=True)
    if kind == "response.failed":
        error = (payload.get("response") or {}).get("error")
        return StreamUpdate(error=_error_text(error or "response.failed"), done=True)
    if kind == "error":
        return StreamUpdate(error=_error_text(payload.get("error") or payload), done=True)
    return StreamUpdate()


# --- Anthropic Messages -----------------------------------------------------------------


def _messages_body(prompt: str, options: GenerationOptions) -> dict[str, Any]:
    return {
        **_common(options, ignore_eos=False),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": options.max_tokens,
    }


def _messages_parse(payload: dict[str, Any]) -> StreamUpdate:
    kind = payload.get("type")
    if kind == "content_block_delta":
        delta = payload.get("delta") or {}
        text = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        return StreamUpdate(text=text)
    if kind == "message_start":
        usage = (payload.get("message") or {}).get("usage") or {}
        return StreamUpdate(prompt_tokens=usage.get("input_tokens"))
    if kind == "message_delta":  # cumulative output count at the end of the message
        return StreamUpdate(output_tokens=(payload.get("usage") or {}).get("output_tokens"))
    if kind == "message_stop":
        return StreamUpdate(done=True)
    if kind == "error":
        return StreamUpdate(error=_error_text(payload.get("error") or payload), done=True)
    return StreamUpdate()


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": Endpoint("/v1/chat/completions", _chat_body, _chat_parse),
    "/v1/completions": Endpoint("/v1/completions", _completions_body, _completions_parse),
    "/v1/responses": Endpoint("/v1/responses", _responses_body, _responses_parse, ignore_eos=False),
    "/v1/messages": Endpoint(
        "/v1/messages",
        _messages_body,
        _messages_parse,
        headers=(("anthropic-version", "2023-06-01"),),
        ignore_eos=False,
    ),
}
