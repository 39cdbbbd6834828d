"""Wire structs of a Responses create request and of an input-token count request.

msgspec checks types and ranges, so those errors name their field (`temperature`,
`reasoning.effort`). Unlike Chat Completions, unknown top-level (and nested option) fields
are refused with `unknown_parameter`: the Responses contract lists every field it serves.
`input`, `tools` and `tool_choice` stay untyped here; items.py and tools.py check them so
that every error carries its exact `input[3].content[0].text`-style location.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ninfer.protocols.generation_fields import (
    NonNegativeInt,
    Penalty,
    Seed,
    Temperature,
    TopK,
    UnitFloat,
)
from ninfer.server.errors import ApiError, from_decode_error


class Reasoning(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None  # the deprecated spelling of `summary`


class TextOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    include_obfuscation: bool | None = None


class PromptCacheOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    mode: str | None = None


class PromptFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What decides the prompt: shared by create and input-token counting."""

    model: str | None = None
    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    truncation: str | None = None
    preserve_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    conversation: Any = None  # recognized, refused: Conversations are not served


class CreateRequest(PromptFields, kw_only=True, forbid_unknown_fields=True):
    max_output_tokens: NonNegativeInt | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    metadata: dict[str, Any] | None = None  # string values, checked in lowering.py
    client_metadata: dict[str, Any] | None = None  # Codex tracing; no generation effect
    max_tool_calls: NonNegativeInt | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    background: bool | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    # NInfer sampler extensions, with the Chat Completions ranges
    top_k: TopK | None = None
    min_p: UnitFloat | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    # recognized, refused (see lowering.py)
    prompt: Any = None
    context_management: Any = None
    structured_outputs: Any = None

    def sampling_fields(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }


class InputTokensRequest(PromptFields, kw_only=True, forbid_unknown_fields=True):
    pass


_UNKNOWN = re.compile(
    r"^Object contains unknown field `(?P<field>[^`]+)`(?: - at `\$(?P<at>.*)`)?$"
)


def decode_create(body: bytes) -> CreateRequest:
    return _decode(body, CreateRequest)


def decode_input_tokens(body: bytes) -> InputTokensRequest:
    return _decode(body, InputTokensRequest)


def _decode(body: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        unknown = _UNKNOWN.match(str(exc))
        if unknown:
            at = (unknown.group("at") or "").lstrip(".")
            param = f"{at}.{unknown.group('field')}" if at else unknown.group("field")
            raise ApiError(
                400,
                f"unknown parameter: `{param}`",
                code="unknown_parameter",
                param=param,
            ) from None
        raise from_decode_error(exc) from None
    except msgspec.MsgspecError as exc:
        raise from_decode_error(exc) from None
