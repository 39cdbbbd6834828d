"""Chat Completions messages -> the protocol-independent PromptMessages."""

from __future__ import annotations

import json
from typing import Any

from ninfer.prompt import cache_marks
from ninfer.protocols.cache_hints import check_breakpoint
from ninfer.protocols.conversation import CUSTOM_TOOL_INPUT, HistoricalToolCall, PromptMessage
from ninfer.protocols.openai_chat.protocol import ContentPart, Message
from ninfer.server.errors import ApiError, invalid, unsupported

_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_DETAILS = (None, "auto")


def lower_messages(messages: list[Message]) -> list[PromptMessage]:
    if not messages:
        raise invalid("`messages` must contain at least one message", "messages")
    return [_lower_message(i, m) for i, m in enumerate(messages)]


def _lower_message(index: int, message: Message) -> PromptMessage:
    where = f"messages[{index}]"
    role = message.role
    if role not in _ROLES:
        raise invalid(
            f"unknown role `{role}`; expected one of {', '.join(_ROLES)}", f"{where}.role"
        )
    _check_name(where, message)
    if message.content is None and role not in ("assistant",):
        raise invalid(f"a {role} message needs `content`", f"{where}.content")
    content, has_media = _content_text(where, role, message.content)
    if role in ("tool", "function"):
        return _tool_result(where, message, content)
    if role != "assistant":
        for name in ("tool_calls", "function_call", "tool_call_id"):
            if getattr(message, name) is not None:
                raise invalid(f"`{name}` is only allowed on {_owner(name)}", f"{where}.{name}")
        return PromptMessage(role=role, content=content, has_media=has_media, param=where)
    return PromptMessage(
        role="assistant",
        content=content,
        reasoning=_reasoning(where, message),
        tool_calls=_history_calls(where, message),
        has_media=has_media,
        param=where,
    )


def _owner(name: str) -> str:
    return "tool messages" if name == "tool_call_id" else "assistant messages"


def _check_name(where: str, message: Message) -> None:
    name = message.name
    if name is None:
        return
    if not isinstance(name, str):
        raise invalid("`name` must be a string", f"{where}.name", "invalid_type")
    if message.role in ("tool", "function") or not name:
        return  # tool: an ignored compatibility echo; function: the legacy function's name
    raise unsupported(
        f"{where}.name", "participant names cannot be represented by the chat template"
    )


def _tool_result(where: str, message: Message, content: str) -> PromptMessage:
    if message.role == "function":
        if not message.name:
            raise invalid("a legacy function message needs `name`", f"{where}.name")
        return PromptMessage(role="tool", content=content, param=where)
    if not isinstance(message.tool_call_id, str) or not message.tool_call_id:
        raise ApiError(
            400,
            f"missing required parameter `{where}.tool_call_id`",
            code="missing_required_parameter",
            param=f"{where}.tool_call_id",
        )
    return PromptMessage(
        role="tool", content=content, tool_call_id=message.tool_call_id, param=where
    )


def _reasoning(where: str, message: Message) -> str | None:
    primary, alias = message.reasoning_content, message.reasoning
    if primary is not None and alias is not None and primary != alias:
        raise invalid(
            "`reasoning_content` and its alias `reasoning` differ",
            f"{where}.reasoning",
            "conflicting_template_option",
        )
    return primary if primary is not None else alias


def _history_calls(where: str, message: Message) -> list[HistoricalToolCall]:
    calls: list[HistoricalToolCall] = []
    for i, call in enumerate(message.tool_calls or []):
        calls.append(_history_call(call, f"{where}.tool_calls[{i}]"))
    legacy = message.function_call
    if legacy is not None:
        if not isinstance(legacy, dict):
            raise invalid("`function_call` must be an object", f"{where}.function_call")
        calls.append(
            HistoricalToolCall(
                name=_name(legacy, f"{where}.function_call"),
                arguments=_arguments(legacy.get("arguments"), f"{where}.function_call.arguments"),
            )
        )
    return calls


def _history_call(call: Any, where: str) -> HistoricalToolCall:
    if not isinstance(call, dict):
        raise invalid("a tool call must be an object", where, "invalid_type")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise invalid("`id` must be a string", f"{where}.id", "invalid_type")
    kind = call.get("type", "function")
    if kind == "function":
        body = call.get("function")
        if not isinstance(body, dict):
            raise invalid("a function tool call needs a `function` object", f"{where}.function")
        return HistoricalToolCall(
            name=_name(body, f"{where}.function"),
            arguments=_arguments(body.get("arguments"), f"{where}.function.arguments"),
            id=call_id,
        )
    if kind == "custom":
        body = call.get("custom")
        if not isinstance(body, dict) or not isinstance(body.get("input"), str):
            raise invalid("a custom tool call needs `custom.input` text", f"{where}.custom.input")
        return HistoricalToolCall(
            name=_name(body, f"{where}.custom"),
            arguments={CUSTOM_TOOL_INPUT: body["input"]},
            id=call_id,
        )
    raise invalid(f"unknown tool call type `{kind}`", f"{where}.type")


def _name(body: dict[str, Any], where: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("a tool call needs a non-empty string `name`", f"{where}.name")
    return name


def _arguments(arguments: Any, where: str) -> dict[str, Any]:
    """Historical arguments as a JSON object whose member order is the one received."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        raise invalid("`arguments` must be a JSON object text", where, "invalid_type")
    try:
        value = json.loads(arguments)  # dicts keep the text's member order
    except ValueError as exc:
        raise invalid(f"`arguments` is not valid JSON: {exc}", where) from None
    if not isinstance(value, dict):
        raise invalid("`arguments` must encode a JSON object", where)
    return value


def _content_text(
    where: str, role: str, content: str | list[ContentPart] | None
) -> tuple[str, bool]:
    """Text of string content or ordered parts (joined without separators); media present?"""
    if content is None:
        return "", False
    if isinstance(content, str):
        return content, False
    pieces: list[str] = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if part.type == "text":
            if part.text is None:
                raise invalid("a text part needs a `text` string", f"{param}.text")
            pieces.append(part.text)
            if check_breakpoint(part.prompt_cache_breakpoint, f"{param}.prompt_cache_breakpoint"):
                pieces.append(cache_marks.mark(0))  # the prompt path takes it out again
        elif part.type == "refusal" and role == "assistant":
            if part.refusal is None:
                raise invalid("a refusal part needs a `refusal` string", f"{param}.refusal")
            pieces.append(part.refusal)
        elif part.type in ("image_url", "video_url") and role in ("user", "tool"):
            _check_media(part, param)
        elif part.type in ("input_audio", "file"):
            raise unsupported(f"{param}.type", f"`{part.type}` input cannot be read by this model")
        else:
            raise invalid(f"content part type `{part.type}` is not valid here", f"{param}.type")
    return "".join(pieces), False


def _check_media(part: ContentPart, param: str) -> None:
    source = part.image_url if part.type == "image_url" else part.video_url
    detail = source.get("detail") if isinstance(source, dict) else None
    if detail not in _DETAILS:
        raise unsupported(
            f"{param}.{part.type}.detail",
            "only `auto` image detail is available; the vision encoder has one resolution policy",
        )
    raise ApiError(
        400,
        "media input needs the vision tower, which this server did not load",
        code="vision_disabled",
        param=f"{param}.type",
    )
