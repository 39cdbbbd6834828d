"""The one place where failures become HTTP errors in the OpenAI envelope.

Handlers raise ApiError (or let typed engine errors propagate); the app's boundary wrapper
turns both into a status code and `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import re

import msgspec

from ninfer.engine_types import (
    ContextLengthExceeded,
    EngineOverloaded,
    EngineUnavailable,
    QueueTimeout,
)


class ApiError(Exception):
    """A failure with a known HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None,
        param: str | None = None,
        type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _default_type(status)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def invalid(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def unsupported(param: str, guarantee: str) -> ApiError:
    """A recognized option whose behaviour this build cannot provide."""
    return ApiError(
        400,
        f"`{param}` is not supported: {guarantee}",
        code="unsupported_parameter",
        param=param,
    )


def from_engine_error(exc: Exception) -> ApiError | None:
    """Map a typed engine refusal to its HTTP error; None for anything else."""
    if isinstance(exc, EngineOverloaded):
        return ApiError(
            429,
            "the server is at capacity (all lanes busy and the pending queue is full); retry later",
            code="server_overloaded",
        )
    if isinstance(exc, QueueTimeout):
        return ApiError(
            503,
            "the request waited past the pending deadline without getting a lane",
            code="request_queue_timeout",
        )
    if isinstance(exc, ContextLengthExceeded):
        return context_length_exceeded(exc.prompt_tokens, exc.max_context)
    if isinstance(exc, EngineUnavailable):
        return ApiError(503, f"the engine is unavailable: {exc}", code="service_unavailable")
    return None


def from_unhandled(exc: Exception) -> ApiError | None:
    """The HTTP error for a failure that escaped its handler; None for an internal fault.

    Beyond the engine's typed refusals, a RecursionError can only come from a request value
    nested deeper than the interpreter's stack allows (the JSON decoder, a template walking
    `chat_template_kwargs`, a tool schema): it is the client's input, so a 400, not a 500.
    """
    if isinstance(exc, RecursionError):
        return too_deep()
    return from_engine_error(exc)


def too_deep() -> ApiError:
    return ApiError(
        400,
        "request body is not accepted: its JSON arrays and objects nest too deeply to "
        "process (several hundred levels); flatten the nested value",
        code="json_too_deep",
    )


def context_length_exceeded(
    prompt_tokens: int, max_context: int, param: str = "messages"
) -> ApiError:
    return ApiError(
        400,
        f"the prompt has {prompt_tokens} tokens but this server's context ceiling is "
        f"{max_context} tokens",
        code="context_length_exceeded",
        param=param,
    )


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`")


def from_decode_error(exc: msgspec.MsgspecError | RecursionError) -> ApiError:
    """Turn a msgspec decode/validation failure into a 400 naming the offending field."""
    if isinstance(exc, RecursionError):
        return too_deep()
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json")
    text = str(exc)
    match = _AT_PATH.search(text)
    path = match.group("path") if match else ""
    detail = text[: match.start()] if match else text
    missing = _MISSING.match(detail)
    if missing:
        param = _join_path(path, missing.group("field"))
        return ApiError(
            400,
            f"missing required parameter `{param}`",
            code="missing_required_parameter",
            param=param,
        )
    param = path.lstrip(".") or None
    code = (
        "invalid_type"
        if detail.startswith("Expected `") and ", got `" in detail
        else "invalid_value"
    )
    where = f" for `{param}`" if param else ""
    return ApiError(400, f"invalid value{where}: {detail}", code=code, param=param)


def _join_path(path: str, field: str) -> str:
    path = path.lstrip(".")
    return f"{path}.{field}" if path else field
