"""Wire structs of a Chat Completions request.

Types and ranges that msgspec can check live here, so a wrong type names its field
(`$.messages[0].content`). Semantic checks that need context (roles, content parts,
unsupported options) live in lowering.py. Unknown top-level fields are ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ninfer.protocols.generation_fields import GenerationFields, Int64, NonNegativeInt


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: Any = None
    video_url: Any = None
    prompt_cache_breakpoint: Any = None  # {"mode": "explicit"}: a cache write candidate


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: Any = None  # a string on tool messages is ignored; other roles refuse names
    reasoning_content: str | None = None
    reasoning: str | None = None  # alias of reasoning_content (vLLM, OpenRouter)
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    function_call: Any = None  # legacy assistant function-call history


class ChatCompletionRequest(GenerationFields, kw_only=True):
    messages: list[Message]
    max_tokens: NonNegativeInt | None = None
    max_completion_tokens: NonNegativeInt | None = None
    logprobs: bool | None = None
    top_logprobs: Int64 | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    verbosity: str | None = None
    web_search_options: Any = None
    audio: dict[str, Any] | None = None  # output voice/format: inert for text-only output
    store: bool | None = None
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    timings_per_token: bool | None = None
    return_progress: bool | None = None
    structured_outputs: Any = None
    parallel_tool_calls: bool | None = None
    tool_constraints: str | None = None  # NInfer: "basic" (default) or "auto"
    prompt_cache_options: Any = None  # {"mode": "implicit" | "explicit"}: cache write hints


def decode_request(body: bytes) -> ChatCompletionRequest:
    """Parse and type-check a body; raises msgspec errors that name the field."""
    return msgspec.json.decode(body, type=ChatCompletionRequest)
