"""Typing Qwen's untyped parameter text with the tool's JSON schema, and the arguments JSON.

Qwen writes every parameter value as raw text. A direct top-level `type` of the parameter's
schema, or an anyOf/oneOf whose branches all name explicit JSON types, guides the conversion;
it never decides whether markup is a call. The rules (serving spec, "non-strict tools"):

* a value whose admitted types include "string" stays the raw string, the empty one included;
* an empty (whitespace-only) block for a parameter that admits no string is omitted;
* "true"/"false" in any letter case become booleans where "boolean" is admitted;
* JSON text keeps its JSON type, admitted or not (a mismatch stays structured so the tool
  consumer can report the validation error); other non-JSON text becomes a JSON string;
* without a supported explicit type, untyped inference applies: JSON text other than a JSON
  string literal becomes that value, anything else stays the raw string.

Repeated parameter names keep the last value at the first key's position, as JSON object
syntax does; members are serialized in that order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})

# The declared tools of a request: function name -> its parameters JSON schema (None when the
# tool declares none). Member order of schemas is irrelevant here.
ToolSchemas = Mapping[str, Mapping[str, Any] | None]


@dataclass(slots=True)
class ArgumentStats:
    """Normalization counters for request_done.result.tool_call_parse."""

    empty_non_string_omitted: int = 0
    schema_mismatch_preserved: int = 0
    duplicate_parameters_repaired: int = 0


def _type_names(value: object) -> set[str] | None:
    if isinstance(value, str):
        return {value} if value in JSON_TYPES else None
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        names = set(value)
        return names if names <= JSON_TYPES else None
    return None


def admitted_types(parameter_schema: object) -> frozenset[str] | None:
    """The JSON types a parameter explicitly admits, or None when untyped inference applies."""
    if not isinstance(parameter_schema, Mapping):
        return None
    if "type" in parameter_schema:
        names = _type_names(parameter_schema["type"])
        return frozenset(names) if names else None
    for combinator in ("anyOf", "oneOf"):
        branches = parameter_schema.get(combinator)
        if not isinstance(branches, list) or not branches:
            continue
        union: set[str] = set()
        for branch in branches:
            names = _type_names(branch.get("type")) if isinstance(branch, Mapping) else None
            if not names:
                return None
            union |= names
        return frozenset(union)
    return None


def parameter_schema(tool_schema: Mapping[str, Any] | None, name: str) -> object:
    if not isinstance(tool_schema, Mapping):
        return None
    properties = tool_schema.get("properties")
    return properties.get(name) if isinstance(properties, Mapping) else None


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def parse_json(text: str) -> tuple[bool, Any]:
    """(True, value) when `text` is one strict JSON value (no NaN/Infinity, finite numbers)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False, None
    if not _finite(value):
        return False, None  # 1e999 parses to inf, which JSON cannot carry back out
    return True, value


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def json_type_matches(value: Any, types: frozenset[str]) -> bool:
    if value is None:
        return "null" in types
    if isinstance(value, bool):
        return "boolean" in types
    if isinstance(value, int):
        return bool(types & {"integer", "number"})
    if isinstance(value, float):
        return "number" in types or ("integer" in types and value.is_integer())
    if isinstance(value, str):
        return "string" in types
    if isinstance(value, list):
        return "array" in types
    return "object" in types


_OMIT = object()


def convert_value(text: str, types: frozenset[str] | None, stats: ArgumentStats) -> Any:
    """The JSON value for one parameter's raw text; `_OMIT` when the parameter is dropped."""
    if types is None:
        ok, value = parse_json(text)
        return value if ok and not isinstance(value, str) else text
    if "string" in types:
        return text
    stripped = text.strip()
    if not stripped:
        stats.empty_non_string_omitted += 1
        return _OMIT
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    ok, value = parse_json(stripped)
    if ok:
        if not json_type_matches(value, types):
            stats.schema_mismatch_preserved += 1
        return value
    stats.schema_mismatch_preserved += 1
    return text


def build_arguments(
    parameters: Sequence[tuple[str, str]],
    tool_schema: Mapping[str, Any] | None,
    stats: ArgumentStats,
) -> str:
    """JSON object text of a call's typed arguments, in first-occurrence key order."""
    last_raw: dict[str, str] = {}  # insertion order is first occurrence; value is the last one
    for name, raw in parameters:
        if name in last_raw:
            stats.duplicate_parameters_repaired += 1
        last_raw[name] = raw
    arguments: dict[str, Any] = {}
    for name, raw in last_raw.items():
        value = convert_value(raw, admitted_types(parameter_schema(tool_schema, name)), stats)
        if value is not _OMIT:
            arguments[name] = value
    return json.dumps(arguments, ensure_ascii=False)
