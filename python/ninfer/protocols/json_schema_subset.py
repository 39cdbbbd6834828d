"""The JSON Schema subset that output constraints enforce, checked before compiling.

The grammar library silently ignores assertions it cannot enforce (uniqueItems, not, ...),
so every schema is walked here first: an output constraint either enforces the whole schema
or the request fails with a field-specific 400 that names the schema location.

* invalid_json_schema: the document is not a well-formed schema (a keyword with the wrong
  type, an unknown `type` name, a `$ref` that does not resolve);
* unsupported_json_schema: a well-formed assertion this server cannot enforce;
* unsatisfiable_json_schema: no value satisfies the schema (empty `enum`, crossed bounds, a
  required property that `additionalProperties: false` forbids).

Errors carry the request field followed by the schema's JSON Pointer, e.g.
`response_format.json_schema.schema/properties/age/minimum`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ninfer.server.errors import ApiError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "$anchor",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
        "contentMediaType",
        "contentEncoding",
        "strict",
    }
)
# Assertions and applicators of JSON Schema that the grammar cannot enforce.
UNSUPPORTED = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
        "$dynamicRef",
        "$recursiveRef",
        "additionalItems",
    }
)
STRING_FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uuid",
    }
)


def schema_error(kind: str, message: str, field: str, pointer: str) -> ApiError:
    location = f"{field}{pointer}"
    return ApiError(
        400,
        f"{message} (at `{location}`)",
        code=f"{kind}_json_schema",
        param=location,
    )


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class SchemaChecker:
    """Walks one schema; raises the first problem as an ApiError."""

    def __init__(self, root: Any, field: str) -> None:
        self.root = root
        self.field = field
        self._resolving: set[str] = set()

    def invalid(self, message: str, pointer: str) -> ApiError:
        return schema_error("invalid", message, self.field, pointer)

    def unsupported(self, message: str, pointer: str) -> ApiError:
        return schema_error("unsupported", message, self.field, pointer)

    def unsatisfiable(self, message: str, pointer: str) -> ApiError:
        return schema_error("unsatisfiable", message, self.field, pointer)

    def check(self) -> None:
        self.walk(self.root, "")

    def walk(self, schema: Any, at: str) -> None:
        if isinstance(schema, bool):
            if schema is False and at == "":
                raise self.unsatisfiable("the schema `false` admits no value", at)
            return
        if not isinstance(schema, dict):
            raise self.invalid("a schema must be an object or a boolean", at)
        for key in schema:
            if key in UNSUPPORTED:
                raise self.unsupported(f"`{key}` cannot be enforced", f"{at}/{_escape(key)}")
        for key in ("$defs", "definitions"):
            defs = schema.get(key)
            if defs is None:
                continue
            if not isinstance(defs, dict):
                raise self.invalid(f"`{key}` must be an object", f"{at}/{key}")
            for name, sub in defs.items():
                self.walk(sub, f"{at}/{key}/{_escape(name)}")
        if "$ref" in schema:
            self.check_ref(schema["$ref"], f"{at}/$ref")
        types = self.types(schema, at)
        self.check_enum(schema, at)
        self.check_composition(schema, at)
        self.check_numbers(schema, at, types)
        self.check_strings(schema, at)
        self.check_arrays(schema, at)
        self.check_objects(schema, at)

    def types(self, schema: dict[str, Any], at: str) -> list[str] | None:
        if "type" not in schema:
            return None
        declared = schema["type"]
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise self.invalid("`type` must be a type name or a list of them", f"{at}/type")
        for i, name in enumerate(names):
            if name not in TYPES:
                where = f"{at}/type" if isinstance(declared, str) else f"{at}/type/{i}"
                raise self.invalid(f"unknown type `{name}`", where)
        if not names:
            raise self.unsatisfiable("an empty `type` list admits no value", f"{at}/type")
        return names

    def check_ref(self, ref: Any, at: str) -> None:
        if not isinstance(ref, str):
            raise self.invalid("`$ref` must be a string", at)
        if not (ref == "#" or ref.startswith("#/")):
            raise self.unsupported("only local references (`#/...`) are supported", at)
        target: Any = self.root
        for raw in ref[2:].split("/") if ref != "#" else []:
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise self.invalid(f"`$ref` `{ref}` does not resolve in this schema", at)
        if not isinstance(target, dict | bool):
            raise self.invalid(f"`$ref` `{ref}` does not point at a schema", at)

    def check_enum(self, schema: dict[str, Any], at: str) -> None:
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list):
                raise self.invalid("`enum` must be a list", f"{at}/enum")
            if not values:
                raise self.unsatisfiable("an empty `enum` admits no value", f"{at}/enum")

    def check_composition(self, schema: dict[str, Any], at: str) -> None:
        for key in ("anyOf", "oneOf", "allOf"):
            if key not in schema:
                continue
            branches = schema[key]
            if not isinstance(branches, list) or not branches:
                raise self.invalid(f"`{key}` must be a non-empty list of schemas", f"{at}/{key}")
            for i, branch in enumerate(branches):
                self.walk(branch, f"{at}/{key}/{i}")
        if isinstance(schema.get("allOf"), list):
            self.check_all_of_types(schema, at)

    def check_all_of_types(self, schema: dict[str, Any], at: str) -> None:
        """allOf is enforced where it reduces: its branches' types must intersect."""
        allowed = set(TYPES)
        own = schema.get("type")
        if isinstance(own, str | list):
            allowed &= _widen({own} if isinstance(own, str) else set(own))
        for branch in schema["allOf"]:
            if isinstance(branch, dict) and isinstance(branch.get("type"), str | list):
                declared = branch["type"]
                allowed &= _widen({declared} if isinstance(declared, str) else set(declared))
        if not allowed:
            raise self.unsatisfiable("the `allOf` branches admit no common type", f"{at}/allOf")

    def bound(self, schema: dict[str, Any], key: str, at: str) -> float | int | None:
        if key not in schema:
            return None
        value = schema[key]
        where = f"{at}/{key}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.invalid(f"`{key}` must be a number", where)
        if isinstance(value, float) and not math.isfinite(value):
            raise self.invalid(f"`{key}` must be finite", where)
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise self.unsupported(
                f"`{key}` {value} is outside the signed 64-bit range integers are exact in", where
            )
        return value

    def check_numbers(self, schema: dict[str, Any], at: str, types: list[str] | None) -> None:
        low = self.bound(schema, "minimum", at)
        high = self.bound(schema, "maximum", at)
        xlow = self.bound(schema, "exclusiveMinimum", at)
        xhigh = self.bound(schema, "exclusiveMaximum", at)
        if "multipleOf" in schema:
            step = self.bound(schema, "multipleOf", at)
            if step is not None and step <= 0:
                raise self.invalid("`multipleOf` must be positive", f"{at}/multipleOf")
            if types != ["integer"] or not isinstance(step, int):
                raise self.unsupported(
                    "`multipleOf` is enforced only as an integer step of `type: integer`",
                    f"{at}/multipleOf",
                )
        lower = max((v for v in (low, xlow) if v is not None), default=None)
        upper = min((v for v in (high, xhigh) if v is not None), default=None)
        if lower is None or upper is None:
            return
        exclusive = (xlow is not None and xlow == lower) or (xhigh is not None and xhigh == upper)
        where = f"{at}/maximum" if high is not None else f"{at}/exclusiveMaximum"
        if lower > upper or (lower == upper and exclusive):
            raise self.unsatisfiable("the number bounds admit no value", where)
        if types == ["integer"]:
            first = (
                math.floor(lower) + 1 if xlow is not None and xlow == lower else math.ceil(lower)
            )
            last = (
                math.ceil(upper) - 1 if xhigh is not None and xhigh == upper else math.floor(upper)
            )
            if first > last:
                raise self.unsatisfiable("the bounds admit no integer", where)

    def count(self, schema: dict[str, Any], key: str, at: str) -> int | None:
        if key not in schema:
            return None
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.invalid(f"`{key}` must be a non-negative integer", f"{at}/{key}")
        return value

    def check_range(self, schema: dict[str, Any], at: str, low_key: str, high_key: str) -> None:
        low = self.count(schema, low_key, at)
        high = self.count(schema, high_key, at)
        if low is not None and high is not None and low > high:
            raise self.unsatisfiable(f"`{low_key}` exceeds `{high_key}`", f"{at}/{high_key}")

    def check_strings(self, schema: dict[str, Any], at: str) -> None:
        self.check_range(schema, at, "minLength", "maxLength")
        if "pattern" in schema:
            pattern = schema["pattern"]
            if not isinstance(pattern, str):
                raise self.invalid("`pattern` must be a string", f"{at}/pattern")
            try:
                re.compile(pattern)
            except re.error as e:
                raise self.invalid(
                    f"`pattern` is not a regular expression: {e}", f"{at}/pattern"
                ) from None
        if "format" in schema:
            fmt = schema["format"]
            if not isinstance(fmt, str):
                raise self.invalid("`format` must be a string", f"{at}/format")
            if fmt not in STRING_FORMATS:
                raise self.unsupported(f"string format `{fmt}` cannot be enforced", f"{at}/format")

    def check_arrays(self, schema: dict[str, Any], at: str) -> None:
        self.check_range(schema, at, "minItems", "maxItems")
        if "prefixItems" in schema:
            prefix = schema["prefixItems"]
            if not isinstance(prefix, list):
                raise self.invalid("`prefixItems` must be a list of schemas", f"{at}/prefixItems")
            for i, item in enumerate(prefix):
                self.walk(item, f"{at}/prefixItems/{i}")
        if "items" in schema:
            items = schema["items"]
            if isinstance(items, list):
                raise self.unsupported(
                    "the list form of `items` is the old spelling; use `prefixItems`", f"{at}/items"
                )
            self.walk(items, f"{at}/items")
            min_items = schema.get("minItems")
            prefix_len = len(schema.get("prefixItems") or [])
            if items is False and isinstance(min_items, int) and min_items > prefix_len:
                raise self.unsatisfiable(
                    "`minItems` exceeds the items `prefixItems` allows", f"{at}/minItems"
                )

    def check_objects(self, schema: dict[str, Any], at: str) -> None:
        self.check_range(schema, at, "minProperties", "maxProperties")
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise self.invalid("`properties` must be an object", f"{at}/properties")
        for name, sub in properties.items():
            self.walk(sub, f"{at}/properties/{_escape(name)}")
        for key in ("patternProperties",):
            if key in schema:
                patterns = schema[key]
                if not isinstance(patterns, dict):
                    raise self.invalid(f"`{key}` must be an object", f"{at}/{key}")
                for pattern, sub in patterns.items():
                    self.walk(sub, f"{at}/{key}/{_escape(pattern)}")
        if "propertyNames" in schema:
            self.walk(schema["propertyNames"], f"{at}/propertyNames")
        extra = schema.get("additionalProperties", True)
        if "additionalProperties" in schema:
            self.walk(extra, f"{at}/additionalProperties")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.invalid("`required` must be a list of property names", f"{at}/required")
        closed = extra is False and not schema.get("patternProperties")
        for i, name in enumerate(required):
            if closed and name not in properties:
                raise self.unsatisfiable(
                    f"required property `{name}` is forbidden by `additionalProperties: false`",
                    f"{at}/required/{i}",
                )
            if properties.get(name) is False:
                raise self.unsatisfiable(
                    f"required property `{name}` has the schema `false`", f"{at}/required/{i}"
                )
        max_props = schema.get("maxProperties")
        if isinstance(max_props, int) and len(set(required)) > max_props:
            raise self.unsatisfiable(
                "more properties are required than `maxProperties` allows", f"{at}/maxProperties"
            )


def _widen(types: set[str]) -> set[str]:
    # An integer is a number: `number` admits both.
    return types | {"integer"} if "number" in types else types


def check_schema(schema: Any, field: str) -> None:
    """Raises invalid/unsupported/unsatisfiable_json_schema for `schema` given at `field`."""
    SchemaChecker(schema, field).check()
