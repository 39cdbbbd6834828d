"""The ASGI application: one route table, auth, CORS, request ids, one error boundary."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ninfer.protocols.openai_responses.store import ResponseStore
from ninfer.protocols.served_model import ServedModel
from ninfer.server.anthropic_errors import anthropic_error, is_anthropic_path
from ninfer.server.anthropic_messages import TokenCountGate, count_tokens, messages
from ninfer.server.chat_completions import chat_completions
from ninfer.server.completions import completions
from ninfer.server.config import AppConfig
from ninfer.server.errors import ApiError, from_unhandled
from ninfer.server.http import ClientDisconnected, HttpRequest, Receive, Send
from ninfer.server.inflight import InflightRequests
from ninfer.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ninfer.server.metrics import ServerMetrics
from ninfer.server.responses import (
    cancel_response,
    compact_response,
    count_input_tokens,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from ninfer.server.telemetry import Telemetry
from ninfer.server.tokenize import detokenize, tokenize, version

log = logging.getLogger("ninfer.server")


Handler = Callable[["NInferApp", HttpRequest, dict[str, str]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str  # "{name}" captures one segment; a trailing one the rest (model ids contain "/")
    handler: Handler
    public: bool = False  # reachable without the API key, and not under /v1/v1

    def match(self, path: str) -> dict[str, str] | None:
        if "{" not in self.path:
            return {} if path == self.path else None
        prefix, _, rest = self.path.partition("{")
        name, _, suffix = rest.partition("}")
        if not (path.startswith(prefix) and path.endswith(suffix)):
            return None
        value = path[len(prefix) : len(path) - len(suffix)]
        if not value or (suffix and "/" in value):
            return None
        return {name: value}


async def _health(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    if app.served.engine.healthy:
        await request.send_json(200, {"status": "ok"})
    else:
        await request.send_json(503, {"status": "unavailable"})


async def _metrics(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    body = app.metrics.exposition()
    headers = [
        (b"content-type", METRICS_CONTENT_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await request.start_response(200, headers)
    await request.send_body(body)


async def _list_models(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await request.send_json(200, {"object": "list", "data": [app.model_card()]})


async def _get_model(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    model_id = params["model_id"]
    if model_id != app.served.public_id:
        raise ApiError(
            404,
            f"model `{model_id}` does not exist; this server serves `{app.served.public_id}`",
            code="model_not_found",
            param="model",
            type="invalid_request_error",
        )
    await request.send_json(200, app.model_card())


async def _chat(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await chat_completions(request, app.served, app.config, app.inflight)


async def _completions(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await completions(request, app.served, app.config, app.inflight)


async def _messages(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await messages(request, app.served, app.config, app.inflight)


async def _count_tokens(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await count_tokens(request, app.served, app.config, app.token_counts)


async def _create_response(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await create_response(request, app.served, app.config, app.inflight, app.response_store)


async def _count_input_tokens(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await count_input_tokens(request, app.served, app.config, app.response_store)


async def _compact_response(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await compact_response(request, app.config)


async def _retrieve_response(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await retrieve_response(request, app.response_store, params["response_id"])


async def _delete_response(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await delete_response(request, app.response_store, params["response_id"])


async def _list_input_items(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await list_input_items(request, app.response_store, params["response_id"])


async def _cancel_response(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await cancel_response(request, app.response_store, params["response_id"])


async def _tokenize(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await tokenize(request, app.served, app.config)


async def _detokenize(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await detokenize(request, app.served, app.config)


async def _version(app: NInferApp, request: HttpRequest, params: dict[str, str]) -> None:
    await version(request)


ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", _health, public=True),
    Route("GET", "/metrics", _metrics),
    Route("GET", "/v1/models", _list_models),
    Route("GET", "/v1/models/{model_id}", _get_model),
    Route("POST", "/v1/chat/completions", _chat),
    Route("POST", "/v1/completions", _completions),
    Route("POST", "/v1/messages", _messages),
    Route("POST", "/v1/messages/count_tokens", _count_tokens),
    Route("POST", "/v1/responses", _create_response),
    Route("POST", "/v1/responses/input_tokens", _count_input_tokens),
    Route("POST", "/v1/responses/compact", _compact_response),
    Route("GET", "/v1/responses/{response_id}/input_items", _list_input_items),
    Route("POST", "/v1/responses/{response_id}/cancel", _cancel_response),
    Route("GET", "/v1/responses/{response_id}", _retrieve_response),
    Route("DELETE", "/v1/responses/{response_id}", _delete_response),
    Route("POST", "/tokenize", _tokenize),
    Route("POST", "/detokenize", _detokenize),
    Route("GET", "/version", _version),
)

_DOUBLED_PREFIX = "/v1/v1/"


class NInferApp:
    def __init__(
        self,
        served: ServedModel,
        config: AppConfig,
        on_ready: Callable[[], None] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.served = served
        self.config = config
        self.created = int(time.time())
        self._on_ready = on_ready
        self.metrics = ServerMetrics(served.engine, self.identity())
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        if self.telemetry.metrics is None:
            self.telemetry.metrics = self.metrics
        if hasattr(served.engine, "on_scheduling"):  # pause/restore boundaries, for the log
            served.engine.on_scheduling = self.telemetry.scheduling
        self.inflight = InflightRequests(self.telemetry)
        self.token_counts = TokenCountGate(config.token_count_capacity)
        self.response_store = ResponseStore(
            config.response_store_max_records, config.response_store_max_mib
        )
        self.ready = False  # set once Granian listens and the lifespan startup ran

    def begin_shutdown(self) -> None:
        """Refuse new generation requests and end the running and queued ones (503)."""
        if not self.inflight.closing:
            log.info("stopping: ending %d request(s) in flight", len(self.inflight))
        self.inflight.shutdown()

    def identity(self) -> dict[str, str]:
        """Labels of ninfer_model_info: what is served, on what."""
        info = self.served.engine.model_info
        return {
            "model": self.served.public_id,
            "architecture": str(info.get("architecture") or ""),
            "weight_format": str(info.get("ftype") or ""),
            "backend": self.config.backend,
        }

    def model_card(self) -> dict[str, Any]:
        info = dict(self.served.engine.model_info)
        meta = {
            key: info.get(key)
            for key in ("n_vocab", "n_ctx", "n_ctx_train", "n_embd", "n_params", "size", "ftype")
        }
        meta["n_ctx"] = self.served.max_context
        for key in ("kv_capacity", "kv_dtype", "prefix_reuse"):  # the resolved shared KV pool
            if key in info:
                meta[key] = info[key]
        return {
            "id": self.served.public_id,
            "object": "model",
            "created": self.created,
            "owned_by": "ninfer",
            "max_model_len": self.served.max_context,
            "meta": meta,
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if self._on_ready is not None:
                    self._on_ready()
                self.ready = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request_id = f"req_{uuid.uuid4().hex}"
        common = self._common_headers(request_id, scope)

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *common]}
            await send(message)

        request = HttpRequest(scope, receive, send_with_headers, request_id)
        try:
            await self._dispatch(request)
        except ClientDisconnected:
            log.debug("%s client disconnected", request_id)
        except Exception as exc:  # the one boundary where every failure becomes a response
            await self._send_error(request, exc)

    async def _dispatch(self, request: HttpRequest) -> None:
        if request.method == "OPTIONS":
            await request.send_empty(204)  # CORS preflight: always open
            return
        route, params = self._route(request)
        if not route.public:
            self._authenticate(request)
        await route.handler(self, request, params)

    def _route(self, request: HttpRequest) -> tuple[Route, dict[str, str]]:
        path = request.path
        doubled = path.startswith(_DOUBLED_PREFIX)
        if doubled:
            path = path[len("/v1") :]
        method_mismatch = False
        for route in ROUTES:
            if doubled and route.public:
                continue
            params = route.match(path)
            if params is None:
                continue
            if route.method == request.method:
                return route, params
            method_mismatch = True
        if method_mismatch:
            raise ApiError(
                405,
                f"method {request.method} is not allowed on {request.path}",
                code="method_not_allowed",
            )
        raise ApiError(404, f"no route for {request.method} {request.path}", code="not_found")

    def _authenticate(self, request: HttpRequest) -> None:
        expected = self.config.api_key
        if expected is None:
            return
        supplied = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization", "")
        if supplied is None and authorization[:7].lower() == "bearer ":
            supplied = authorization[7:].strip()
        if supplied is None or not hmac.compare_digest(supplied.encode(), expected.encode()):
            raise ApiError(
                401,
                "missing or invalid API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)",
                code="invalid_api_key",
                type="invalid_request_error",
            )

    def _common_headers(self, request_id: str, scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        # Anthropic routes carry Anthropic's `request-id`; every other route `x-request-id`.
        id_header = b"request-id" if is_anthropic_path(scope.get("path", "")) else b"x-request-id"
        headers = [(id_header, request_id.encode())]
        if self.config.cors:
            requested = b"*"
            for key, value in scope.get("headers", []):
                if key.lower() == b"access-control-request-headers":
                    requested = value
            headers += [
                (b"access-control-allow-origin", b"*"),
                (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                (b"access-control-allow-headers", requested),
                (b"access-control-expose-headers", id_header),
                (b"access-control-max-age", b"86400"),
            ]
        return headers

    async def _send_error(self, request: HttpRequest, exc: Exception) -> None:
        error = exc if isinstance(exc, ApiError) else from_unhandled(exc)
        if error is None:
            log.exception("%s %s %s failed", request.request_id, request.method, request.path)
            error = ApiError(500, "internal server error", code="internal_error")
        elif error.status < 500:
            log.info(
                "%s %s %s: %d %s (%s)",
                request.request_id,
                request.method,
                request.path,
                error.status,
                error.code,
                error.param or "-",
            )
        else:
            log.warning(
                "%s %s %s: %s", request.request_id, request.method, request.path, error.message
            )
        self.telemetry.rejected(request, error)
        if request.response_started:
            return  # a stream reports its own failures; nothing more can be said here
        if is_anthropic_path(request.path):
            await request.send_json(*anthropic_error(error, request.request_id))
            return
        await request.send_json(error.status, error.body())
