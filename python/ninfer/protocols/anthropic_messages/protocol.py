"""Wire structs of a Messages (and count_tokens) request.

msgspec checks what it can type (a wrong type names its field, `$.messages[0].role`); content
blocks, tools, thinking and cache markers stay JSON objects here and are checked where they
are lowered, so each refusal can name its block and the capability it lacks. Unknown
top-level fields are ignored, as the protocol's advisory fields must not block a request.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
UnitFloat = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class MessageParam(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[dict[str, Any]]


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: list[MessageParam]
    max_tokens: int | None = None
    system: str | list[dict[str, Any]] | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    top_k: NonNegativeInt | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    # Advisory: accepted without effect on generation.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    context_management: Any = None
    # Execution-dependent features this server does not have.
    container: Any = None
    mcp_servers: list[Any] | None = None
    # NInfer extensions shared with the OpenAI endpoints.
    chat_template_kwargs: dict[str, Any] | None = None
    preserve_thinking: bool | None = None
    structured_outputs: Any = None
    tool_constraints: str | None = None


def decode_request(body: bytes) -> MessagesRequest:
    """Parse and type-check a body; raises msgspec errors that name the field."""
    return msgspec.json.decode(body, type=MessagesRequest)
