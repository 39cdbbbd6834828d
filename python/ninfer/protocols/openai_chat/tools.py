"""Chat Completions tools and tool_choice -> ToolDefinitions and the callable tool names.

This build serves the unconstrained route: tool_choice and parallel_tool_calls select which
calls the output decoder parses; they are not enforced on the sampler (structured outputs
bring the constrained route).
"""

from __future__ import annotations

from typing import Any

from ninfer.protocols.conversation import ToolDefinition
from ninfer.server.errors import invalid, unsupported


def parse_tools(tools: list[Any] | None) -> list[ToolDefinition]:
    definitions: list[ToolDefinition] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid("a tool must be an object", where, "invalid_type")
        kind = tool.get("type", "function")
        if kind == "function":
            definition = _function_tool(tool.get("function"), f"{where}.function")
        elif kind == "custom":
            definition = _custom_tool(tool.get("custom"), f"{where}.custom")
        elif kind in ("web_search", "web_search_preview", "file_search", "code_interpreter"):
            raise unsupported(f"{where}.type", f"hosted `{kind}` tools are not available")
        else:
            raise invalid(
                f"unknown tool type `{kind}`; expected `function` or `custom`", f"{where}.type"
            )
        if definition.name in seen:
            raise invalid(f"tool name `{definition.name}` is declared twice", f"{where}")
        seen.add(definition.name)
        definitions.append(definition)
    return definitions


def _tool_name(body: dict[str, Any], where: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("a tool needs a non-empty string `name`", f"{where}.name")
    return name


def _function_tool(body: Any, where: str) -> ToolDefinition:
    if not isinstance(body, dict):
        raise invalid("a function tool needs a `function` object", where)
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid("`parameters` must be a JSON Schema object", f"{where}.parameters")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("`description` must be a string", f"{where}.description", "invalid_type")
    strict = body.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("`strict` must be a boolean", f"{where}.strict", "invalid_type")
    return ToolDefinition(
        name=_tool_name(body, where),
        description=description,
        parameters=parameters,
        strict=bool(strict),
    )


def _custom_tool(body: Any, where: str) -> ToolDefinition:
    if not isinstance(body, dict):
        raise invalid("a custom tool needs a `custom` object", where)
    fmt = body.get("format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise unsupported(
            f"{where}.format", "grammar-constrained custom tool input is not available"
        )
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("`description` must be a string", f"{where}.description", "invalid_type")
    return ToolDefinition(name=_tool_name(body, where), description=description, custom=True)


def callable_tools(tool_choice: Any, tools: list[ToolDefinition]) -> set[str] | None:
    """Names whose calls the decoder parses; None when tool calling is off this turn."""
    names = [t.name for t in tools]
    if tool_choice is None:
        return set(names) if names else None
    if tool_choice == "none":
        return None
    if tool_choice in ("auto", "required"):
        if tool_choice == "required" and not names:
            raise invalid("tool_choice `required` needs at least one tool", "tool_choice")
        return set(names) if names else None
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind in ("function", "custom"):
            return {_selected_name(tool_choice, kind, names, "tool_choice")}
        if kind == "allowed_tools":
            return _allowed_tools(tool_choice.get("allowed_tools"), names)
    raise invalid(
        "tool_choice must be `none`, `auto`, `required`, a named function or custom tool, "
        "or an `allowed_tools` object",
        "tool_choice",
    )


def _selected_name(choice: Any, kind: str, names: list[str], where: str) -> str:
    body = choice.get(kind) if isinstance(choice, dict) else None
    name = body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid(f"a {kind} selection needs `{kind}.name`", f"{where}.{kind}.name")
    if name not in names:
        raise invalid(f"`{name}` is not one of the request's tools", f"{where}.{kind}.name")
    return name


def _allowed_tools(body: Any, names: list[str]) -> set[str] | None:
    where = "tool_choice.allowed_tools"
    if not isinstance(body, dict):
        raise invalid("`allowed_tools` must be an object", where)
    if body.get("mode", "auto") not in ("auto", "required"):
        raise invalid("`mode` must be `auto` or `required`", f"{where}.mode")
    listed = body.get("tools")
    if not isinstance(listed, list):
        raise invalid("`tools` must be a list", f"{where}.tools")
    allowed: set[str] = set()
    for i, entry in enumerate(listed):
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind not in ("function", "custom"):
            raise invalid(
                "each allowed tool is a function or custom selection", f"{where}.tools[{i}]"
            )
        allowed.add(_selected_name(entry, kind, names, f"{where}.tools[{i}]"))
    return allowed
