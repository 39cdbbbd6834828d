"""Responses tools and tool_choice -> ToolDefinitions, callable names and namespaces.

* `function` tools are declared flat (`name`, `parameters` beside `type`);
* a `namespace` groups functions; each member gets the internal name `namespace__name`, so
  the same function name may live in two namespaces, and output restores the pair;
* a free-form `custom` tool (Codex's `apply_patch`) is served the way Chat Completions
  serves one: a one-string `input` function under the caller's own name. A grammar format is
  not enforced (there is no constrained route here); its definition is appended to the
  description the model reads;
* hosted tools the server cannot execute (`web_search` and kin) are left out of the prompt
  with one warning line per request; a tool_choice that forces one is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ninfer.protocols.conversation import ToolDefinition
from ninfer.server.errors import invalid, unsupported

log = logging.getLogger("ninfer.server")

NAMESPACE_SEPARATOR = "__"
HOSTED_TOOL_TYPES = (
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "web_search_2025_08_26",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "computer",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
)  # a tuple, not a set: membership must not hash whatever JSON `type` holds


@dataclass(frozen=True, slots=True)
class ToolIdentity:
    """The client's view of one served function: its name and optional namespace."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(slots=True)
class ResponseTools:
    definitions: list[ToolDefinition] = field(default_factory=list)
    identities: dict[str, ToolIdentity] = field(default_factory=dict)  # internal name -> id
    dropped: list[str] = field(default_factory=list)  # hosted tool types left out

    def internal_name(self, name: str, namespace: str | None) -> str:
        return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name

    def identity(self, internal: str) -> ToolIdentity:
        return self.identities.get(internal) or ToolIdentity(internal)


def parse_tools(tools: list[Any] | None, request_id: str = "-") -> ResponseTools:
    parsed = ResponseTools()
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid("a tool must be an object", where, "invalid_type")
        kind = tool.get("type")
        if kind == "function":
            _add(parsed, _function_tool(tool, where), None, where)
        elif kind == "custom":
            _add(parsed, _custom_tool(tool, where), None, where)
        elif kind == "namespace":
            _namespace(parsed, tool, where)
        elif kind in HOSTED_TOOL_TYPES:
            parsed.dropped.append(kind)
        elif not isinstance(kind, str):
            raise invalid("a tool needs a string `type`", f"{where}.type")
        else:
            raise invalid(
                f"unknown tool type `{_show(kind)}`; expected function, custom or namespace",
                f"{where}.type",
            )
    if parsed.dropped:
        log.warning(
            "%s responses: hosted tools this server cannot execute left out of the prompt: %s",
            request_id,
            ", ".join(parsed.dropped),
        )
    return parsed


def _add(
    parsed: ResponseTools, definition: ToolDefinition, namespace: str | None, where: str
) -> None:
    identity = ToolIdentity(definition.name, namespace, definition.custom)
    definition.name = parsed.internal_name(definition.name, namespace)
    if definition.name in parsed.identities:
        shown = f"{namespace}.{identity.name}" if namespace else identity.name
        raise invalid(f"tool `{_show(shown)}` is declared twice", f"{where}.name")
    parsed.identities[definition.name] = identity
    parsed.definitions.append(definition)


def _namespace(parsed: ResponseTools, tool: dict[str, Any], where: str) -> None:
    name = _name(tool, where)
    members = tool.get("tools")
    if not isinstance(members, list) or not members:
        raise invalid("a namespace needs a non-empty `tools` list", f"{where}.tools")
    for j, member in enumerate(members):
        at = f"{where}.tools[{j}]"
        if not isinstance(member, dict):
            raise invalid("a namespace member must be an object", at, "invalid_type")
        if member.get("type") != "function":
            raise unsupported(f"{at}.type", "namespace members must be function tools")
        _add(parsed, _function_tool(member, at), name, at)


def _name(body: dict[str, Any], where: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("a tool needs a non-empty string `name`", f"{where}.name")
    return name


def _description(body: dict[str, Any], where: str) -> str | None:
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("`description` must be a string", f"{where}.description", "invalid_type")
    return description


def _function_tool(body: dict[str, Any], where: str) -> ToolDefinition:
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid("`parameters` must be a JSON Schema object", f"{where}.parameters")
    strict = body.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("`strict` must be a boolean", f"{where}.strict", "invalid_type")
    if body.get("defer_loading"):
        raise unsupported(f"{where}.defer_loading", "every declared tool is in the prompt")
    if body.get("output_schema") is not None:
        raise unsupported(f"{where}.output_schema", "tool output schemas are not used")
    return ToolDefinition(
        name=_name(body, where),
        description=_description(body, where),
        parameters=parameters,
        strict=bool(strict),
    )


def _custom_tool(body: dict[str, Any], where: str) -> ToolDefinition:
    description = _description(body, where)
    fmt = body.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
            raise invalid("`format` must be a text or grammar format", f"{where}.format")
        definition = fmt.get("definition")
        if fmt.get("type") == "grammar" and isinstance(definition, str) and definition:
            syntax = fmt.get("syntax") if isinstance(fmt.get("syntax"), str) else "grammar"
            note = f"The input must follow this {syntax} grammar:\n{definition}"
            description = f"{description}\n\n{note}" if description else note
    return ToolDefinition(name=_name(body, where), description=description, custom=True)


def callable_tools(tool_choice: Any, tools: ResponseTools) -> set[str] | None:
    """Internal names whose calls the decoder parses; None when tool calling is off."""
    names = [d.name for d in tools.definitions]
    if tool_choice is None or tool_choice == "auto":
        return set(names) if names else None
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        if not names:
            raise invalid("tool_choice `required` needs at least one function tool", "tool_choice")
        return set(names)
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind in ("function", "custom"):
            return {_selected(tool_choice, kind, tools, "tool_choice")}
        if kind == "allowed_tools":
            return _allowed_tools(tool_choice, tools)
        if kind in HOSTED_TOOL_TYPES:
            raise unsupported(
                "tool_choice.type",
                f"`{kind}` is a hosted tool this server cannot execute, so it cannot be forced",
            )
    raise invalid(
        "tool_choice must be `none`, `auto`, `required`, a function or custom selection, "
        "or an `allowed_tools` object",
        "tool_choice",
    )


def _selected(choice: dict[str, Any], kind: str, tools: ResponseTools, where: str) -> str:
    name = choice.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"a {kind} selection needs `name`", f"{where}.name")
    namespace = choice.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise invalid("`namespace` must be a string", f"{where}.namespace", "invalid_type")
    internal = tools.internal_name(name, namespace)
    identity = tools.identities.get(internal)
    if identity is None or identity.custom != (kind == "custom"):
        shown = f"{namespace}.{name}" if namespace else name
        raise invalid(f"`{_show(shown)}` is not one of the request's {kind} tools", f"{where}.name")
    return internal


def _allowed_tools(choice: dict[str, Any], tools: ResponseTools) -> set[str]:
    where = "tool_choice"
    if choice.get("mode", "auto") not in ("auto", "required"):
        raise invalid("`mode` must be `auto` or `required`", f"{where}.mode")
    listed = choice.get("tools")
    if not isinstance(listed, list):
        raise invalid("`tools` must be a list", f"{where}.tools")
    allowed: set[str] = set()
    for i, entry in enumerate(listed):
        at = f"{where}.tools[{i}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind in HOSTED_TOOL_TYPES:
            raise unsupported(f"{at}.type", "allowed_tools may only list function tools")
        if kind not in ("function", "custom"):
            raise invalid("each allowed tool is a function or custom selection", f"{at}.type")
        allowed.add(_selected(entry, kind, tools, at))
    if choice.get("mode") == "required" and not allowed:
        raise invalid("mode `required` needs at least one allowed tool", f"{where}.tools")
    return allowed


def _show(value: str, limit: int = 64) -> str:
    text = value.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= limit else text[:limit] + "..."
