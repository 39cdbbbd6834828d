"""Input Items: validation into canonical Items, and their lowering to PromptMessages.

`normalize_input` checks the request's `input` and returns canonical Items (string input
becomes one user message; string content becomes one text part; every Item gets an id, the
client's own when given). Canonical Items are what input_items lists and what the store
keeps, so a continued chain lowers stored Items exactly like new ones.

`lower_items` turns canonical Items into the conversation the template renders:

* contiguous assistant-owned Items (reasoning, assistant messages, function and custom tool
  calls) form one assistant turn in the order reasoning -> content -> calls; an order that
  needs rearranging is `invalid_assistant_history`;
* a run of tool results answers the calls of the turn right before it; results are matched
  by call_id and put in call order; an unknown or repeated call_id, or a result set with a
  gap (a later call answered, an earlier one not) is `invalid_tool_history`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ninfer.prompt import cache_marks
from ninfer.protocols.conversation import CUSTOM_TOOL_INPUT, HistoricalToolCall, PromptMessage
from ninfer.protocols.openai_responses.tools import ResponseTools
from ninfer.server.errors import ApiError, invalid, unsupported

_ROLES = ("user", "assistant", "system", "developer")
_ID_PREFIX = {
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
}
_UNSUPPORTED_ITEMS = (
    "item_reference",
    "file_search_call",
    "web_search_call",
    "computer_call",
    "computer_call_output",
    "code_interpreter_call",
    "image_generation_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_call",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
)
# Remote compaction (Codex's built-in OpenAI provider) asks for it with a trigger Item and
# replays the opaque `compaction` Item it got back; neither exists here.
_COMPACTION_ITEMS = ("compaction_trigger", "compaction")
_PARTIAL_STATUSES = ("in_progress", "incomplete")


def new_item_id(kind: str) -> str:
    return f"{_ID_PREFIX.get(kind, 'item')}_{secrets.token_hex(16)}"


def compaction_not_supported(param: str | None = None) -> ApiError:
    return ApiError(
        400,
        "remote compaction is not available on this server; compact the conversation "
        'client-side (Codex does so with a custom model provider, wire_api = "responses")',
        code="compaction_not_supported",
        param=param,
    )


# ---- validation ----------------------------------------------------------------------


def normalize_input(value: str | list[Any] | None) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}], None)]
    items = [_normalize_item(item, f"input[{i}]") for i, item in enumerate(value)]
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        if item["id"] in seen:
            raise invalid(
                f"item id `{_show(item['id'])}` is used twice (input[{seen[item['id']]}] and "
                f"input[{i}])",
                f"input[{i}].id",
            )
        seen[item["id"]] = i
    return items


def _message(role: str, content: list[dict[str, Any]], item_id: str | None) -> dict[str, Any]:
    return {
        "id": item_id or new_item_id("message"),
        "type": "message",
        "role": role,
        "content": content,
    }


def _normalize_item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid("an input Item must be an object", where, "invalid_type")
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"  # the easy message form leaves `type` out
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not item_id):
        raise invalid("an Item `id` must be a non-empty string", f"{where}.id", "invalid_type")
    if kind == "message":
        normalized = _normalize_message(item, where)
    elif kind == "reasoning":
        normalized = _normalize_reasoning(item, where)
    elif kind in ("function_call", "custom_tool_call"):
        normalized = _normalize_call(item, kind, where)
    elif kind in ("function_call_output", "custom_tool_call_output"):
        normalized = _normalize_result(item, kind, where)
    elif kind in _COMPACTION_ITEMS:
        raise compaction_not_supported(f"{where}.type")
    elif kind in _UNSUPPORTED_ITEMS:
        raise unsupported(f"{where}.type", f"`{kind}` Items are not served by this server")
    elif isinstance(kind, str):
        raise invalid(f"unknown input Item type `{_show(kind)}`", f"{where}.type")
    else:
        raise invalid("an input Item needs a string `type`", f"{where}.type")
    normalized.pop("id", None)
    return {"id": item_id or new_item_id(kind), **normalized}  # the id first, as OpenAI lists it


def _string(item: dict[str, Any], key: str, where: str, *, empty: bool = True) -> str:
    value = item.get(key)
    if value is None:
        raise ApiError(
            400,
            f"missing required parameter `{where}.{key}`",
            code="missing_required_parameter",
            param=f"{where}.{key}",
        )
    if not isinstance(value, str):
        raise invalid(f"`{key}` must be a string", f"{where}.{key}", "invalid_type")
    if not empty and not value:
        raise invalid(f"`{key}` must not be empty", f"{where}.{key}")
    return value


def _optional_string(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise invalid(f"`{key}` must be a string", f"{where}.{key}", "invalid_type")
    return value


def _normalize_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise invalid(
            f"unknown role `{_show(str(role))}`; expected one of {', '.join(_ROLES)}",
            f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        part_type = "output_text" if role == "assistant" else "input_text"
        parts = [_text_part(part_type, content)]
    elif isinstance(content, list):
        parts = [_content_part(role, p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    elif content is None:
        raise ApiError(
            400,
            f"missing required parameter `{where}.content`",
            code="missing_required_parameter",
            param=f"{where}.content",
        )
    else:
        raise invalid(
            "`content` must be a string or a list of parts", f"{where}.content", "invalid_type"
        )
    message = _message(role, parts, None)
    for key in ("status", "phase"):  # accepted metadata with no prompt representation
        value = _optional_string(item, key, where)
        if value is not None:
            message[key] = value
    return message


def _text_part(part_type: str, text: str) -> dict[str, Any]:
    if part_type == "output_text":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": part_type, "text": text}


def _content_part(role: str, part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise invalid("a content part must be an object", where, "invalid_type")
    kind = part.get("type")
    _check_breakpoint(part, where)
    if kind == "input_text" or (kind == "output_text" and role == "assistant"):
        text = _text_part(kind, _string(part, "text", where))
        if part.get("prompt_cache_breakpoint") is not None:
            text["prompt_cache_breakpoint"] = {"mode": "explicit"}  # a write candidate
        return text
    if kind == "refusal" and role == "assistant":
        return {"type": "refusal", "refusal": _string(part, "refusal", where)}
    if kind in ("input_image", "input_video") and role in ("user", "assistant"):
        _media(part, kind, where)
    if kind in ("input_file", "input_audio"):
        raise unsupported(f"{where}.type", f"`{kind}` input cannot be read by this model")
    raise invalid(
        f"content part type `{_show(str(kind))}` is not valid in a {role} message", f"{where}.type"
    )


def _check_breakpoint(part: dict[str, Any], where: str) -> None:
    marker = part.get("prompt_cache_breakpoint")
    if marker is None:
        return
    if not isinstance(marker, dict) or marker.get("mode") != "explicit":
        raise invalid(
            '`prompt_cache_breakpoint` must be {"mode": "explicit"}',
            f"{where}.prompt_cache_breakpoint",
        )


def _media(part: dict[str, Any], kind: str, where: str) -> None:
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise unsupported(f"{where}.file_id", "images are read from URLs, not file ids")
        if part.get("detail") not in (None, "auto"):
            raise unsupported(f"{where}.detail", "only `auto` image detail is available")
    raise ApiError(
        400,
        "media input needs the vision tower, which this server did not load",
        code="vision_disabled",
        param=f"{where}.type",
    )


def _normalize_reasoning(item: dict[str, Any], where: str) -> dict[str, Any]:
    content = item.get("content") or []
    summary = item.get("summary") or []
    if not isinstance(content, list):
        raise invalid("`content` must be a list of reasoning_text parts", f"{where}.content")
    if not isinstance(summary, list):
        raise invalid("`summary` must be a list of summary_text parts", f"{where}.summary")
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "reasoning_text":
            raise invalid("reasoning content parts must be `reasoning_text`", f"{at}.type")
        _string(part, "text", at)
    for j, part in enumerate(summary):
        at = f"{where}.summary[{j}]"
        if not isinstance(part, dict) or part.get("type") != "summary_text":
            raise invalid("summary parts must be `summary_text`", f"{at}.type")
        _string(part, "text", at)
    encrypted = _optional_string(item, "encrypted_content", where)
    if not content and (summary or encrypted):
        raise unsupported(
            f"{where}.content",
            "a reasoning Item is replayed from its raw `reasoning_text` content; a summary or "
            "encrypted content cannot stand in for it",
        )
    result: dict[str, Any] = {"type": "reasoning", "summary": summary, "content": content}
    if encrypted is not None:
        result["encrypted_content"] = encrypted
    return result


def _normalize_call(item: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    status = _optional_string(item, "status", where)
    if status in _PARTIAL_STATUSES:
        raise unsupported(f"{where}.status", "only completed tool calls can be replayed")
    call_id = _string(item, "call_id", where, empty=False)
    name = _string(item, "name", where, empty=False)
    result: dict[str, Any] = {"type": kind, "call_id": call_id, "name": name}
    if kind == "function_call":
        namespace = _optional_string(item, "namespace", where)
        arguments = _string(item, "arguments", where)
        _parse_arguments(arguments, f"{where}.arguments")
        if namespace:
            result["namespace"] = namespace
        result["arguments"] = arguments
    else:
        result["input"] = _string(item, "input", where)
    result["status"] = "completed"
    return result


def _parse_arguments(arguments: str, where: str) -> dict[str, Any]:
    if arguments.strip() == "":
        return {}
    try:
        value = json.loads(arguments)  # dicts keep the text's member order
    except ValueError as exc:
        raise invalid(f"`arguments` is not valid JSON: {exc}", where) from None
    if not isinstance(value, dict):
        raise invalid("`arguments` must encode a JSON object", where)
    return value


def _normalize_result(item: dict[str, Any], kind: str, where: str) -> dict[str, Any]:
    status = _optional_string(item, "status", where)
    if status in _PARTIAL_STATUSES:
        raise unsupported(f"{where}.status", "only completed tool results can be replayed")
    result: dict[str, Any] = {"type": kind, "call_id": _string(item, "call_id", where, empty=False)}
    output = item.get("output")
    if isinstance(output, list):
        if not output:
            raise invalid("`output` parts must not be empty", f"{where}.output")
        for j, part in enumerate(output):
            at = f"{where}.output[{j}]"
            if not isinstance(part, dict):
                raise invalid("an output part must be an object", at, "invalid_type")
            _check_breakpoint(part, at)
            if part.get("type") in ("input_image", "input_video"):
                _media(part, part["type"], at)
            if part.get("type") == "input_file":
                raise unsupported(f"{at}.type", "`input_file` cannot be read by this model")
            if part.get("type") != "input_text":
                raise invalid("tool output parts must be `input_text`", f"{at}.type")
            _string(part, "text", at)
    elif not isinstance(output, str):
        if output is None:
            raise ApiError(
                400,
                f"missing required parameter `{where}.output`",
                code="missing_required_parameter",
                param=f"{where}.output",
            )
        raise invalid(
            "`output` must be a string or a list of parts", f"{where}.output", "invalid_type"
        )
    result["output"] = output
    for key in ("name", "namespace"):  # an optional assertion on the answered call
        value = _optional_string(item, key, where)
        if value is not None:
            result[key] = value
    return result


# ---- lowering ------------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    call_id: str
    name: str
    namespace: str | None


@dataclass(slots=True)
class _Group:
    """One assistant turn under construction."""

    param: str
    phase: int = 0  # 0: reasoning, 1: content, 2: calls
    reasoning: list[str] | None = None
    content: list[str] = field(default_factory=list)
    calls: list[HistoricalToolCall] = field(default_factory=list)
    identities: list[_Call] = field(default_factory=list)


_PHASES = {"reasoning": 0, "message": 1, "function_call": 2, "custom_tool_call": 2}


class _Lowering:
    def __init__(self, tools: ResponseTools) -> None:
        self.tools = tools
        self.messages: list[PromptMessage] = []
        self.group: _Group | None = None
        self.answered: list[_Call] = []  # the calls the current result run answers
        self.results: dict[int, PromptMessage] = {}
        self.results_param = ""

    def add(self, item: dict[str, Any], param: str) -> None:
        kind = item["type"]
        if kind in _PHASES and (kind != "message" or item["role"] == "assistant"):
            self._flush_results()
            self._assistant(item, kind, param)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self._result(item, param)
        else:
            self._flush_group()
            self._flush_results()
            self.answered = []
            self.messages.append(
                PromptMessage(role=item["role"], content=_text(item["content"]), param=param)
            )

    def finish(self) -> list[PromptMessage]:
        self._flush_group()
        self._flush_results()
        return self.messages

    def _assistant(self, item: dict[str, Any], kind: str, param: str) -> None:
        group = self.group
        if group is None:
            group = self.group = _Group(param)
        phase = _PHASES[kind]
        if phase < group.phase:
            earlier = ("reasoning", "message content", "tool calls")[group.phase]
            raise ApiError(
                400,
                f"{param} ({kind}) follows {earlier} of the same assistant turn; an assistant "
                "turn is rendered as reasoning, then message content, then tool calls",
                code="invalid_assistant_history",
                param=param,
            )
        group.phase = phase
        if kind == "reasoning":
            text = "".join(p["text"] for p in item["content"])
            group.reasoning = [*(group.reasoning or []), text]
        elif kind == "message":
            group.content.append(_text(item["content"]))
        elif kind == "function_call":
            namespace = item.get("namespace")
            group.calls.append(
                HistoricalToolCall(
                    name=self.tools.internal_name(item["name"], namespace),
                    arguments=_parse_arguments(item["arguments"], f"{param}.arguments"),
                    id=item["call_id"],
                )
            )
            group.identities.append(_Call(item["call_id"], item["name"], namespace))
        else:
            group.calls.append(
                HistoricalToolCall(
                    name=item["name"],
                    arguments={CUSTOM_TOOL_INPUT: item["input"]},
                    id=item["call_id"],
                )
            )
            group.identities.append(_Call(item["call_id"], item["name"], None))

    def _flush_group(self) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        self.messages.append(
            PromptMessage(
                role="assistant",
                content="".join(group.content),
                reasoning="\n".join(group.reasoning) if group.reasoning is not None else None,
                tool_calls=group.calls,
                param=group.param,
            )
        )
        self.answered = group.identities

    def _result(self, item: dict[str, Any], param: str) -> None:
        self._flush_group()
        call_id = item["call_id"]
        index = next((i for i, c in enumerate(self.answered) if c.call_id == call_id), None)
        if index is None:
            raise _tool_history(
                f"{param} answers call_id `{_show(call_id)}`, which is not a call of the "
                "assistant turn right before it",
                f"{param}.call_id",
            )
        if index in self.results:
            raise _tool_history(f"call_id `{_show(call_id)}` is answered twice", f"{param}.call_id")
        call = self.answered[index]
        for key, expected in (("name", call.name), ("namespace", call.namespace)):
            if key in item and item[key] != expected:
                raise _tool_history(
                    f"{param}.{key} `{_show(item[key])}` does not match the call it answers "
                    f"(`{_show(str(expected))}`)",
                    f"{param}.{key}",
                )
        if not self.results:
            self.results_param = param
        self.results[index] = PromptMessage(
            role="tool", content=_output_text(item["output"]), tool_call_id=call_id, param=param
        )

    def _flush_results(self) -> None:
        if not self.results:
            return
        order = sorted(self.results)
        if order != list(range(len(order))):
            missing = self.answered[next(i for i in range(len(order)) if i not in self.results)]
            raise _tool_history(
                f"the result of call_id `{_show(missing.call_id)}` is missing while a later "
                "call of the same turn is answered",
                self.results_param,
            )
        self.messages += [self.results[i] for i in order]
        self.results = {}
        self.answered = []


def lower_items(
    entries: Iterable[tuple[dict[str, Any], str]], tools: ResponseTools
) -> list[PromptMessage]:
    """Canonical Items with the request location each came from -> the prompt's messages."""
    lowering = _Lowering(tools)
    for item, param in entries:
        lowering.add(item, param)
    return lowering.finish()


def _tool_history(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_tool_history", param=param)


def _text(parts: list[dict[str, Any]]) -> str:
    """The parts' text; a breakpoint part ends with its cache mark (the prompt path takes it
    out again and keeps the exact token frontier as a write candidate)."""
    return "".join(
        (p["refusal"] if p["type"] == "refusal" else p["text"])
        + (cache_marks.mark(0) if p.get("prompt_cache_breakpoint") else "")
        for p in parts
    )


def _output_text(output: str | list[dict[str, Any]]) -> str:
    return output if isinstance(output, str) else "".join(p["text"] for p in output)


def _show(value: str, limit: int = 64) -> str:
    text = value.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= limit else text[:limit] + "..."
