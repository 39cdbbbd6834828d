"""Errors of the Anthropic routes in Anthropic's envelope and categories.

Handlers raise the same ApiError as everywhere; at the boundary an Anthropic route renders it
as `{"type": "error", "error": {"type", "message"}, "request_id"}` (plus NInfer's `code` and
`param` inside `error`, which clients ignore), with the field named in the message as
Anthropic does. Local admission overload is 529 overloaded_error and a queue timeout 504.
"""

from __future__ import annotations

from typing import Any

from ninfer.server.errors import ApiError

ANTHROPIC_ROOT = "/v1/messages"
_DOUBLED_PREFIX = "/v1/v1/"
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_STATUS_BY_CODE = {"server_overloaded": 529, "request_queue_timeout": 504}


def is_anthropic_path(path: str) -> bool:
    if path.startswith(_DOUBLED_PREFIX):
        path = path[len("/v1") :]
    # Every path under /v1/messages, so an Anthropic SDK calling an endpoint this server
    # lacks (message batches) still gets an error it can parse.
    return path == ANTHROPIC_ROOT or path.startswith(ANTHROPIC_ROOT + "/")


def anthropic_error(error: ApiError, request_id: str) -> tuple[int, dict[str, Any]]:
    """(status, body) of `error` on an Anthropic route."""
    status = _STATUS_BY_CODE.get(error.code or "", error.status)
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    body: dict[str, Any] = {"type": _TYPES.get(status, "api_error"), "message": message}
    if error.code:
        body["code"] = error.code
    if error.param:
        body["param"] = error.param
    return status, {"type": "error", "error": body, "request_id": request_id}
