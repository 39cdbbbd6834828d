"""Messages `tools` and `tool_choice` -> ToolDefinitions, callable names, the call limit.

User-defined tools only (their `input_examples` are rendered with the declaration, so the
model sees them): Anthropic-provided tools (bash, text editor, computer use, web
search/fetch, code execution, memory, tool search), MCP toolsets and tools that exclude
direct model calls are refused by name. `defer_loading` tools are rendered as ordinary tools:
this server has no tool search, and Claude Code marks some tools that way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ninfer.protocols.anthropic_messages.cache_control import CacheBreakpoints
from ninfer.protocols.constraints import ToolPolicy
from ninfer.protocols.conversation import ToolDefinition
from ninfer.server.errors import invalid, unsupported

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_CHOICES = ("auto", "any", "tool", "none")


@dataclass(slots=True)
class ToolSelection:
    callable: set[str] | None  # names the decoder parses; None = tool calling off
    single_call: bool  # disable_parallel_tool_use


def parse_tools(tools: list[Any] | None, cache: CacheBreakpoints) -> list[ToolDefinition]:
    definitions: list[ToolDefinition] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid("a tool must be an object", where, "invalid_type")
        definition = _tool(tool, where)
        if definition.name in seen:
            raise invalid(f"tool name `{definition.name}` is declared twice", f"{where}.name")
        seen.add(definition.name)
        cache.block(tool, where)
        definitions.append(definition)
    return definitions


def _tool(tool: dict[str, Any], where: str) -> ToolDefinition:
    kind = tool.get("type")
    if kind is not None and kind != "custom":
        if kind == "mcp_toolset":
            raise unsupported(f"{where}.type", "MCP toolsets need a remote MCP client")
        raise unsupported(
            f"{where}.type",
            f"`{kind}` is an Anthropic-provided tool; only user-defined tools (with "
            "`input_schema`) are served",
        )
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid("a tool needs a `name` of 1-128 letters, digits, `_` or `-`", f"{where}.name")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("`description` must be a string", f"{where}.description", "invalid_type")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise invalid("a tool needs an `input_schema` object", f"{where}.input_schema")
    if schema.get("type") != "object":
        raise invalid("`input_schema` must have type `object`", f"{where}.input_schema.type")
    strict = tool.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("`strict` must be a boolean", f"{where}.strict", "invalid_type")
    examples = tool.get("input_examples")
    if examples is not None and (
        not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples)
    ):
        raise invalid("`input_examples` must be a list of objects", f"{where}.input_examples")
    callers = tool.get("allowed_callers")
    if callers is not None and "direct" not in (callers if isinstance(callers, list) else []):
        raise unsupported(
            f"{where}.allowed_callers", "tools the model may not call directly need code execution"
        )
    return ToolDefinition(
        name=name,
        description=description,
        parameters=schema,
        strict=bool(strict),
        input_examples=examples or None,
    )


def select_tools(choice: dict[str, Any] | None, tools: list[ToolDefinition]) -> ToolSelection:
    names = [t.name for t in tools]
    if choice is None:
        return ToolSelection(set(names) if names else None, False)
    kind = choice.get("type")
    if kind not in _CHOICES:
        raise invalid(
            f"tool_choice type must be one of {', '.join(_CHOICES)}, got {kind!r}",
            "tool_choice.type",
        )
    single = choice.get("disable_parallel_tool_use", False)
    if not isinstance(single, bool):
        raise invalid(
            "`disable_parallel_tool_use` must be a boolean",
            "tool_choice.disable_parallel_tool_use",
            "invalid_type",
        )
    if kind == "none":
        return ToolSelection(None, single)
    if kind in ("any", "tool") and not names:
        raise invalid(f"tool_choice `{kind}` needs at least one tool in `tools`", "tool_choice")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise invalid(
                f"tool_choice names {name!r}, which is not in `tools`", "tool_choice.name"
            )
        return ToolSelection({name}, single)
    return ToolSelection(set(names) if names else None, single)


def tool_policy(
    choice: dict[str, Any] | None, tools: list[ToolDefinition], mode: str
) -> ToolPolicy:
    """tool_choice (already checked by select_tools) as the shared ToolPolicy: `any` is one or
    more calls, a named tool one or more calls to it, disable_parallel_tool_use at most one."""
    kind = (choice or {}).get("type", "auto")
    common: dict[str, Any] = {
        "tools": tools,
        "parallel": not (choice or {}).get("disable_parallel_tool_use", False),
        "constraints": mode,
        "schema_params": {t.name: f"tools[{i}].input_schema" for i, t in enumerate(tools)},
    }
    if kind == "any":
        return ToolPolicy(choice="required", **common)
    if kind == "tool":
        return ToolPolicy(choice="required", allowed=frozenset({choice["name"]}), **common)
    return ToolPolicy(choice=kind, **common)
