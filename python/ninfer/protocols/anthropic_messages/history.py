"""Messages `system` and `messages` -> the protocol-independent PromptMessages.

* Consecutive User or Assistant messages are one turn, their blocks joined without
  separators; System messages (top level or mid-conversation) keep their position.
* A first top-level System block starting with `x-anthropic-billing-header:` is Claude Code's
  attribution line: it is dropped with its cache marker, before counting and rendering.
* Assistant turns carry thinking (visible text, or the reasoning an NInfer signature holds
  when the text is empty), text, and tool_use calls (input objects in received order).
* Every tool_use needs exactly one tool_result among the leading blocks of the next User
  turn; results are matched by id and rendered in call order. A history may begin with
  results (a truncated or imported conversation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.protocols.anthropic_messages import signature
from ninfer.protocols.anthropic_messages.cache_control import CacheBreakpoints
from ninfer.protocols.anthropic_messages.protocol import MessageParam
from ninfer.protocols.conversation import HistoricalToolCall, PromptMessage
from ninfer.server.errors import ApiError, invalid, unsupported

BILLING_HEADER = "x-anthropic-billing-header:"
TOOL_ERROR_PREFIX = "Error: "
_ROLES = ("user", "assistant", "system")
_SERVER_TOOL_BLOCKS = (
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
)
_CAPABILITIES = {
    "document": "document blocks need document parsing, which this server does not have",
    "search_result": "search result blocks need citations support, which this server lacks",
    "container_upload": "container uploads need a code-execution container",
    **{
        kind: "server-tool blocks need Anthropic-hosted tool execution"
        for kind in _SERVER_TOOL_BLOCKS
    },
}


@dataclass(slots=True)
class _Block:
    body: dict[str, Any]
    where: str

    @property
    def type(self) -> Any:
        return self.body.get("type")


@dataclass(slots=True)
class _Turn:
    role: str
    where: str  # the first message of the turn
    blocks: list[_Block] = field(default_factory=list)


def invalid_tool_history(message: str, where: str) -> ApiError:
    return ApiError(400, message, code="invalid_tool_history", param=where)


def lower_system(
    system: str | list[dict[str, Any]] | None, cache: CacheBreakpoints
) -> list[PromptMessage]:
    if system is None:
        return []
    if isinstance(system, str):
        return [PromptMessage(role="system", content=system, param="system")] if system else []
    blocks = [_Block(b, f"system[{i}]") for i, b in enumerate(system)]
    if blocks and _is_billing_header(blocks[0].body):
        blocks = blocks[1:]  # consumed whole, its cache marker included
    texts = [_system_text(block, cache) for block in blocks]
    return [PromptMessage(role="system", content="".join(texts), param="system")] if blocks else []


def _is_billing_header(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") != "text":
        return False
    text = block.get("text")
    return isinstance(text, str) and text.startswith(BILLING_HEADER)


def _system_text(block: _Block, cache: CacheBreakpoints) -> str:
    _check_object(block)
    if block.type != "text":
        raise invalid(
            f"System blocks must be text blocks, got {block.type!r}", f"{block.where}.type"
        )
    cache.block(block.body, block.where)
    return _text(block) + cache.mark(block.where)


def lower_history(messages: list[MessageParam], cache: CacheBreakpoints) -> list[PromptMessage]:
    if not messages:
        raise invalid("`messages` must contain at least one message", "messages")
    turns = _turns(messages)
    lowered: list[PromptMessage] = []
    pending: tuple[list[HistoricalToolCall], str] | None = None  # calls awaiting results
    for position, turn in enumerate(turns):
        if pending is not None and turn.role != "user":
            raise invalid_tool_history(
                "every tool_use needs its tool_result in the next user message", pending[1]
            )
        if turn.role == "system":
            lowered.append(_system_turn(turn, cache))
        elif turn.role == "assistant":
            message = _assistant_turn(turn, cache)
            lowered.append(message)
            if message.tool_calls:
                pending = (message.tool_calls, turn.where)
        else:
            calls = pending[0] if pending is not None else None
            first = all(t.role == "system" for t in turns[:position])
            lowered += _user_turn(turn, cache, calls, first)
            pending = None
    if pending is not None:
        raise invalid_tool_history(
            "the last assistant message has tool_use blocks without tool_result blocks after "
            "them; send the results in a following user message",
            pending[1],
        )
    return lowered


def _turns(messages: list[MessageParam]) -> list[_Turn]:
    turns: list[_Turn] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.role not in _ROLES:
            raise invalid(
                f"unknown role `{message.role}`; expected user, assistant or system",
                f"{where}.role",
            )
        if isinstance(message.content, str):
            blocks = [_Block({"type": "text", "text": message.content}, f"{where}.content")]
        else:
            blocks = [_Block(b, f"{where}.content[{j}]") for j, b in enumerate(message.content)]
        if turns and turns[-1].role == message.role:
            turns[-1].blocks += blocks  # one turn, joined without separators
        else:
            turns.append(_Turn(message.role, where, blocks))
    return turns


def _text(block: _Block) -> str:
    text = block.body.get("text")
    if not isinstance(text, str):
        raise invalid("a text block needs a `text` string", f"{block.where}.text")
    return text


def _refuse_block(block: _Block, allowed: str) -> ApiError:
    kind = block.type
    if kind in _CAPABILITIES:
        return unsupported(f"{block.where}.type", _CAPABILITIES[kind])
    if kind == "image":
        return _image_error(block)
    return invalid(
        f"content block type {kind!r} is not valid here; expected {allowed}", f"{block.where}.type"
    )


def _image_error(block: _Block) -> ApiError:
    source = block.body.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind not in ("base64", "url", "file"):
        return invalid(
            "an image block needs a `source` of type base64, url or file", f"{block.where}.source"
        )
    if kind == "file":
        return unsupported(f"{block.where}.source", "image file ids need the Files API")
    return ApiError(
        400,
        "image input needs the vision tower, which this server did not load",
        code="vision_disabled",
        param=f"{block.where}.source",
    )


def _system_turn(turn: _Turn, cache: CacheBreakpoints) -> PromptMessage:
    texts = []
    for block in turn.blocks:
        _check_object(block)
        if block.type != "text":
            raise _refuse_block(block, "text (System messages carry text only)")
        cache.block(block.body, block.where)
        texts.append(_text(block) + cache.mark(block.where))
    return PromptMessage(role="system", content="".join(texts), param=turn.where)


def _check_object(block: _Block) -> None:
    if not isinstance(block.body, dict):
        raise invalid("a content block must be an object", block.where, "invalid_type")
    if not isinstance(block.type, str):
        raise invalid("a content block needs a string `type`", f"{block.where}.type")


def _assistant_turn(turn: _Turn, cache: CacheBreakpoints) -> PromptMessage:
    reasoning: list[str] = []
    saw_thinking = False
    texts: list[str] = []
    calls: list[HistoricalToolCall] = []
    for block in turn.blocks:
        _check_object(block)
        kind = block.type
        if kind == "thinking":
            saw_thinking = True
            reasoning.append(_thinking_text(block))
        elif kind == "redacted_thinking":
            saw_thinking = True  # opaque to this model: nothing to replay
        elif kind == "text":
            cache.block(block.body, block.where)
            texts.append(_text(block) + cache.mark(block.where))
        elif kind == "tool_use":
            cache.block(block.body, block.where)
            calls.append(_tool_use(block, calls))
        else:
            raise _refuse_block(block, "text, thinking, redacted_thinking or tool_use")
    return PromptMessage(
        role="assistant",
        content="".join(texts),
        reasoning="".join(reasoning) if saw_thinking else None,
        tool_calls=calls,
        param=turn.where,
    )


def _thinking_text(block: _Block) -> str:
    text = block.body.get("thinking", "")
    if not isinstance(text, str):
        raise invalid("a thinking block needs a `thinking` string", f"{block.where}.thinking")
    sig = block.body.get("signature")
    if sig is not None and not isinstance(sig, str):
        raise invalid("`signature` must be a string", f"{block.where}.signature", "invalid_type")
    if text:
        return text  # visible text wins; the signature is transport metadata
    restored = signature.restore(sig, f"{block.where}.signature")
    return restored if restored is not None else ""


def _tool_use(block: _Block, earlier: list[HistoricalToolCall]) -> HistoricalToolCall:
    call_id, name, arguments = block.body.get("id"), block.body.get("name"), block.body.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid("a tool_use block needs a non-empty string `id`", f"{block.where}.id")
    if any(c.id == call_id for c in earlier):
        raise invalid_tool_history(
            f"tool_use id `{call_id}` appears twice in one turn", f"{block.where}.id"
        )
    if not isinstance(name, str) or not name:
        raise invalid("a tool_use block needs a non-empty string `name`", f"{block.where}.name")
    if not isinstance(arguments, dict):
        raise invalid("a tool_use block needs an `input` object", f"{block.where}.input")
    return HistoricalToolCall(name=name, arguments=arguments, id=call_id)


def _user_turn(
    turn: _Turn,
    cache: CacheBreakpoints,
    calls: list[HistoricalToolCall] | None,
    first: bool,
) -> list[PromptMessage]:
    results: dict[str, PromptMessage] = {}
    order: list[str] = []
    texts: list[str] = []
    leading = True
    for block in turn.blocks:
        _check_object(block)
        if block.type == "tool_result":
            if not leading:
                raise invalid_tool_history(
                    "tool_result blocks must come first in their user message", block.where
                )
            result = _tool_result(block, cache)
            if result.tool_call_id in results:
                raise invalid_tool_history(
                    f"tool_use id `{result.tool_call_id}` has two tool_result blocks",
                    f"{block.where}.tool_use_id",
                )
            results[result.tool_call_id or ""] = result
            order.append(result.tool_call_id or "")
            continue
        leading = False
        if block.type != "text":
            raise _refuse_block(block, "text, image or tool_result")
        cache.block(block.body, block.where)
        texts.append(_text(block) + cache.mark(block.where))
    lowered = _ordered_results(turn, results, order, calls, first)
    if texts or not results:
        lowered.append(PromptMessage(role="user", content="".join(texts), param=turn.where))
    return lowered


def _ordered_results(
    turn: _Turn,
    results: dict[str, PromptMessage],
    order: list[str],
    calls: list[HistoricalToolCall] | None,
    first: bool,
) -> list[PromptMessage]:
    if calls is None:
        if results and not first:
            raise invalid_tool_history(
                f"tool_result for `{order[0]}` does not follow an assistant tool_use",
                f"{turn.where}.content",
            )
        return [results[i] for i in order]
    expected = [c.id or "" for c in calls]
    for call_id in order:
        if call_id not in expected:
            raise invalid_tool_history(
                f"tool_result for `{call_id}` matches no tool_use of the previous assistant "
                "message",
                f"{turn.where}.content",
            )
    missing = [i for i in expected if i not in results]
    if missing:
        raise invalid_tool_history(
            f"tool_use `{missing[0]}` has no tool_result at the start of the next user message",
            f"{turn.where}.content",
        )
    return [results[i] for i in expected]  # call order


def _tool_result(block: _Block, cache: CacheBreakpoints) -> PromptMessage:
    call_id = block.body.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(
            "a tool_result needs a non-empty string `tool_use_id`", f"{block.where}.tool_use_id"
        )
    is_error = block.body.get("is_error", False)
    if not isinstance(is_error, bool):
        raise invalid("`is_error` must be a boolean", f"{block.where}.is_error", "invalid_type")
    cache.block(block.body, block.where)
    content = block.body.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(
            _result_part(_Block(p, f"{block.where}.content[{k}]"), cache)
            for k, p in enumerate(content)
        )
    else:
        raise invalid(
            "tool_result `content` must be a string or a list of blocks", f"{block.where}.content"
        )
    if is_error:
        text = TOOL_ERROR_PREFIX + text
    text += cache.mark(block.where)
    return PromptMessage(role="tool", content=text, tool_call_id=call_id, param=block.where)


def _result_part(part: _Block, cache: CacheBreakpoints) -> str:
    _check_object(part)
    if part.type == "text":
        cache.block(part.body, part.where)
        return _text(part) + cache.mark(part.where)
    if part.type == "tool_reference":
        # Tool search results (Claude Code's deferred tools): the referenced tool's name.
        name = part.body.get("tool_name")
        if not isinstance(name, str) or not name:
            raise invalid("a tool_reference needs a `tool_name` string", f"{part.where}.tool_name")
        return name
    raise _refuse_block(part, "text, image or tool_reference")
