"""Output and tool constraints: one lowering for every protocol.

Each protocol parses its own request fields into an OutputConstraint (Chat `response_format`,
Responses `text.format`, Anthropic `output_config.format`, and the NInfer extension
`structured_outputs`) and a ToolPolicy (tool_choice, allowed tools, parallel calls). This
module checks them against each other and against the request (one output constraint, no
custom stops, GBNF/choice/regex only without active tools) and lowers them to one
GrammarSpec: the source the engine compiles (engine.compile_grammar) before admission.

Errors are ApiErrors in the OpenAI shape (status 400, code, param); a protocol with another
envelope (Anthropic) re-wraps them.

Wiring a protocol (see openai_chat/constraints.py):
1. output = single_output_constraint(parse_response_format(...), parse_structured_outputs(...))
   (Responses `text.format` and Anthropic `output_config.format` use nested=False);
2. policy = ToolPolicy(...) from the protocol's tool choice. Anthropic: `any` is
   choice="required"; a named tool is choice="required" with allowed={name} (one or more
   calls to it); disable_parallel_tool_use is parallel=False. OpenAI named is choice="named";
3. spec = lower_constraints(output, policy, stop_strings=...), then
   bind_to_generation(spec, generation, thinking_on=..., tokenizer=...);
4. before submit: generation.constraint = await compile_constraint(engine, spec);
5. on the terminal result: observation(event.constraint, branch=observed_branch(...)).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ninfer.engine_types import GenerationRequest
from ninfer.protocols.conversation import ToolDefinition
from ninfer.protocols.json_schema_subset import check_schema, schema_error
from ninfer.server.errors import ApiError, invalid, unsupported

# Qwen's XML tool-call framing (the format every built-in template renders and the output
# decoder parses: outputs/qwen_tool_calls.py).
THINK_END = "</think>"
THINK_LEAD = "\n\n"
TOOL_CALL_TRIGGER = "<tool_call>"
TOOL_CALL_OPEN = "<tool_call>\n<function={name}>"
TOOL_CALL_CLOSE = "\n</function>\n</tool_call>"
TOOL_CALL_SEPARATOR = "\n"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "\n</parameter>"
# Inside structural tags the library allows free whitespace between JSON tokens and Qwen XML
# parameters; one character keeps the framing's line breaks and rules out runs of blanks.
MAX_WHITESPACE = 1


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """What the answer content must be, as the request stated it."""

    kind: str  # json_object | json_schema | grammar | choice | regex
    param: str  # the request field that carries it (errors name it)
    schema: Any = None  # json_schema
    schema_param: str = ""  # where the schema itself sits (JSON Pointers extend it)
    strict: bool = False
    text: str = ""  # grammar / regex
    choices: tuple[str, ...] = ()

    @property
    def is_json(self) -> bool:
        return self.kind in ("json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """Which calls the turn may or must make (the spec's tool-choice table)."""

    tools: list[ToolDefinition]  # every declared tool, in declaration order
    choice: str = "auto"  # auto | none | required | named
    allowed: frozenset[str] | None = None  # callable names; None = every declared tool
    parallel: bool = True  # False: at most one call (exactly one when a call is required)
    constraints: str = "basic"  # basic: framing always enforced; auto: only when requested
    param: str = "tool_choice"
    tools_param: str = "tools"

    def callable(self) -> list[ToolDefinition]:
        return [t for t in self.tools if self.allowed is None or t.name in self.allowed]

    @property
    def active(self) -> bool:
        """Whether the model may call tools this turn."""
        return self.choice != "none" and bool(self.callable())


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """What the engine compiles: a grammar kind, its canonical source, and how a rejection
    by the grammar library is reported."""

    kind: str  # json_schema | strict_json_schema | ebnf | regex | structural_tag
    source: str
    param: str
    error_code: str
    branches: tuple[str, ...] = field(default=("content",))  # content and/or tools
    # False for tool-only constraints: an engine without grammar support (a test double)
    # serves them on the unconstrained route, whose decoder still parses calls by tool choice.
    required: bool = True
    lead: str = ""  # literal text before the language (the line breaks after `</think>`)


# --- request fields -> OutputConstraint ------------------------------------------------------


def parse_response_format(value: Any, param: str, *, nested: bool) -> OutputConstraint | None:
    """An OpenAI-style format object: {"type": "text" | "json_object" | "json_schema", ...}.

    nested=True is the Chat Completions shape (`json_schema: {name, schema, strict}`);
    nested=False the flat Responses / Anthropic shape (`schema` and `strict` beside `type`).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("the format must be an object", param, "invalid_type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object", param)
    if kind != "json_schema":
        raise invalid(
            f"unknown format type `{kind}`; expected `text`, `json_object` or `json_schema`",
            f"{param}.type",
        )
    body = value.get("json_schema") if nested else value
    body_param = f"{param}.json_schema" if nested else param
    if not isinstance(body, dict):
        raise invalid("`json_schema` must be an object", body_param, "invalid_type")
    if "schema" not in body:
        raise invalid("a JSON Schema format needs `schema`", f"{body_param}.schema")
    strict = body.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("`strict` must be a boolean", f"{body_param}.strict", "invalid_type")
    schema_param = f"{body_param}.schema"
    check_schema(body["schema"], schema_param)
    return OutputConstraint(
        "json_schema",
        param,
        schema=body["schema"],
        schema_param=schema_param,
        strict=bool(strict),
    )


def parse_structured_outputs(
    value: Any, param: str = "structured_outputs"
) -> OutputConstraint | None:
    """The NInfer extension: exactly one of `grammar` (GBNF), `choice` or `regex`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("`structured_outputs` must be an object", param, "invalid_type")
    members = [k for k in ("grammar", "choice", "regex") if value.get(k) is not None]
    unknown = sorted(set(value) - {"grammar", "choice", "regex"})
    if unknown:
        raise invalid(
            f"unknown member `{unknown[0]}`; supply exactly one of `grammar`, `choice`, `regex`",
            f"{param}.{unknown[0]}",
        )
    if len(members) != 1:
        raise invalid("supply exactly one of `grammar`, `choice` or `regex`", param)
    member = members[0]
    where = f"{param}.{member}"
    body = value[member]
    if member == "grammar":
        if not isinstance(body, str) or not body.strip():
            raise ApiError(
                400,
                "`grammar` must be a non-empty GBNF string",
                code="invalid_grammar",
                param=where,
            )
        return OutputConstraint("grammar", where, text=body)
    if member == "regex":
        if not isinstance(body, str):
            raise ApiError(400, "`regex` must be a string", code="invalid_regex", param=where)
        check_regex(body, where)
        return OutputConstraint("regex", where, text=body)
    if not isinstance(body, list) or not body:
        raise ApiError(
            400, "`choice` must be a non-empty list of strings", code="invalid_choice", param=where
        )
    for i, entry in enumerate(body):
        if not isinstance(entry, str):
            raise ApiError(
                400, "each choice must be a string", code="invalid_choice", param=f"{where}[{i}]"
            )
    return OutputConstraint("choice", where, choices=tuple(dict.fromkeys(body)))


def single_output_constraint(*candidates: OutputConstraint | None) -> OutputConstraint | None:
    """Only one output constraint per request."""
    given = [c for c in candidates if c is not None]
    if len(given) > 1:
        raise invalid(
            f"only one output constraint may be supplied; `{given[0].param}` and "
            f"`{given[1].param}` both constrain the output",
            given[1].param,
            "conflicting_constraints",
        )
    return given[0] if given else None


# --- regex language check ------------------------------------------------------------------

_KNOWN_ESCAPES = set("dDwWsStnrfv0") | set(r"\.^$|?*+()[]{}/-")
_CLASS_ESCAPES = _KNOWN_ESCAPES | {"b"}  # [\b] is a backspace inside a class


def check_regex(pattern: str, param: str) -> None:
    """Rejects what the regex language leaves out: lookaround, backreferences, word
    boundaries, Unicode properties, inline flags and unknown escapes (invalid_regex)."""

    def fail(message: str) -> ApiError:
        return ApiError(400, f"{message} in the regex", code="invalid_regex", param=param)

    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern):
                raise fail("a trailing backslash")
            e = pattern[i + 1]
            if e.isdigit() and e != "0":
                raise fail("a backreference")
            if e in "bB" and not in_class:
                raise fail("a word boundary")
            if e in "pP":
                raise fail("a Unicode property class")
            if e == "k":
                raise fail("a named backreference")
            if e == "x":
                if not re.fullmatch(r"[0-9A-Fa-f]{2}", pattern[i + 2 : i + 4]):
                    raise fail("a malformed \\x escape")
                i += 4
                continue
            if e == "u":
                if not re.fullmatch(r"[0-9A-Fa-f]{4}", pattern[i + 2 : i + 6]):
                    raise fail("a malformed \\u escape")
                i += 6
                continue
            if e not in (_CLASS_ESCAPES if in_class else _KNOWN_ESCAPES) and e.isalnum():
                raise fail(f"the unknown escape \\{e}")
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "^":
                i += 1
            if pattern[i + 1 : i + 2] == "]":
                i += 1  # a literal ] first in a class
        elif c == "(" and pattern[i + 1 : i + 2] == "?":
            tail = pattern[i + 2 : i + 4]
            if tail[:1] in ("=", "!") or tail in ("<=", "<!"):
                raise fail("a lookaround")
            if tail[:1] != ":":
                raise fail("an inline flag or named group")
        i += 1
    try:
        re.compile(pattern)
    except re.error as e:
        raise fail(f"a syntax error ({e})") from e


# --- lowering ------------------------------------------------------------------------------


def check_request_compatibility(
    output: OutputConstraint | None,
    tools: ToolPolicy | None,
    *,
    stop_strings: list[str],
    stop_param: str = "stop",
) -> None:
    """The cross-field rules of the contract."""
    if (
        output is not None
        and output.kind in ("grammar", "choice", "regex")
        and tools
        and tools.active
    ):
        raise invalid(
            "GBNF, choice and regex constraints need a turn without active tools; "
            'remove the tools or set `tool_choice: "none"`',
            output.param,
            "conflicting_constraints",
        )
    enforced_tools = tools is not None and tool_constraint_needed(tools, output)
    if stop_strings and (output is not None or enforced_tools):
        what = output.param if output is not None else "tool constraints"
        raise invalid(
            f"custom stop strings cannot be combined with {what}: constrained output ends at the "
            "model's end-of-sequence token"
            + (
                "" if output is not None else '; set `tool_constraints: "auto"` for free generation'
            ),
            stop_param,
            "conflicting_constraints",
        )


def tool_constraint_needed(tools: ToolPolicy, output: OutputConstraint | None) -> bool:
    if not tools.active:
        return False
    if tools.constraints == "basic" or tools.choice != "auto" or not tools.parallel:
        return True
    if output is not None and output.is_json:
        return True
    return any(t.strict for t in tools.callable())


def lower_constraints(
    output: OutputConstraint | None,
    tools: ToolPolicy | None,
    *,
    stop_strings: list[str] | None = None,
    stop_param: str = "stop",
) -> GrammarSpec | None:
    """The one grammar the engine enforces for this turn, or None for free generation."""
    check_request_compatibility(
        output, tools, stop_strings=stop_strings or [], stop_param=stop_param
    )
    calls = tools is not None and tool_constraint_needed(tools, output)
    if not calls:
        return None if output is None else _output_spec(output)
    assert tools is not None
    call_format = _calls_format(tools)
    required = output is not None
    if output is not None and output.is_json and tools.choice == "auto":
        answer = {
            "type": "json_schema",
            "json_schema": _json_schema_of(output),
            "max_whitespace_cnt": MAX_WHITESPACE,
        }
        root: dict[str, Any] = {"type": "or", "elements": [answer, call_format]}
        branches: tuple[str, ...] = ("content", "tools")
    elif tools.choice == "auto" and output is None:
        root = _auto_calls_format(tools)
        branches = ("content", "tools")
    else:
        root = call_format
        branches = ("tools",)
    source = _canonical({"type": "structural_tag", "format": root})
    return GrammarSpec(
        "structural_tag", source, tools.tools_param, "unsupported_json_schema", branches, required
    )


def _canonical(value: Any) -> str:
    # Member order is meaningful (declared property order): never sort keys.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _json_schema_of(output: OutputConstraint) -> Any:
    return {"type": "object"} if output.kind == "json_object" else output.schema


def _output_spec(output: OutputConstraint) -> GrammarSpec:
    if output.kind == "json_object":
        return GrammarSpec("json_schema", '{"type":"object"}', output.param, "invalid_json_schema")
    if output.kind == "json_schema":
        kind = "strict_json_schema" if output.strict else "json_schema"
        return GrammarSpec(
            kind, _canonical(output.schema), output.schema_param, "unsupported_json_schema"
        )
    if output.kind == "grammar":
        return GrammarSpec("ebnf", output.text, output.param, "invalid_grammar")
    if output.kind == "regex":
        return GrammarSpec("regex", _regex_source(output.text), output.param, "invalid_regex")
    alternatives = " | ".join(gbnf_literal(choice) for choice in output.choices)
    return GrammarSpec("ebnf", f"root ::= {alternatives}", output.param, "invalid_choice")


def _regex_source(pattern: str) -> str:
    """Anchors are allowed at the ends of top-level alternatives; the match is always of the
    whole content, so they carry no meaning and are dropped."""
    parts = _top_level_alternatives(pattern)
    trimmed = []
    for part in parts:
        if part.startswith("^"):
            part = part[1:]
        if part.endswith("$") and not part.endswith("\\$"):
            part = part[:-1]
        trimmed.append(part)
    return "|".join(trimmed)


def _top_level_alternatives(pattern: str) -> list[str]:
    parts, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    out = ['"']
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


# --- tool calls ----------------------------------------------------------------------------


def _call_tag(tool: ToolDefinition, index: int, tools_param: str) -> dict[str, Any]:
    if tool.strict:
        schema_param = f"{tools_param}[{index}].function.parameters"
        schema = tool.parameters or {"type": "object", "properties": {}}
        check_strict_parameters(schema, schema_param)
        content = _strict_arguments(schema)
    else:
        # Basic constraint: the framing and a declared name; the arguments stay open.
        content = {"type": "any_text"}
    return {
        "type": "tag",
        "begin": TOOL_CALL_OPEN.format(name=tool.name),
        "content": content,
        "end": TOOL_CALL_CLOSE,
    }


def _strict_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """The parameters of a strict call in Qwen's exact layout, in declaration order:
    `\n<parameter=NAME>\nVALUE\n</parameter>` each, optional ones omissible. (The library's
    qwen_xml style lets whitespace run around values, which would leak into raw strings.)"""
    required = set(schema.get("required") or [])
    items: list[dict[str, Any]] = []
    for name, sub in (schema.get("properties") or {}).items():
        parameter = {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "\n"},
                {
                    "type": "tag",
                    "begin": f"{PARAMETER_OPEN}{name}>\n",
                    "content": _parameter_value(sub),
                    "end": PARAMETER_CLOSE,
                },
            ],
        }
        items.append(parameter if name in required else {"type": "optional", "content": parameter})
    # Each parameter starts on its own line; the function's closer starts with a line break.
    if not items:
        return {"type": "const_string", "value": ""}
    return {"type": "sequence", "elements": items}


def _parameter_value(schema: Any) -> dict[str, Any]:
    """Top-level string parameters are raw text (whitespace kept); everything else JSON."""
    if isinstance(schema, dict) and _raw_string(schema):
        choices = schema.get("enum") if "enum" in schema else None
        if "const" in schema:
            choices = [schema["const"]]
        if choices is not None:
            options = [{"type": "const_string", "value": c} for c in choices]
            return options[0] if len(options) == 1 else {"type": "or", "elements": options}
        if "pattern" in schema:
            return {"type": "regex", "pattern": schema["pattern"]}
        low, high = schema.get("minLength"), schema.get("maxLength")
        if low is not None or high is not None:
            bounds = f"{low or 0},{'' if high is None else high}"
            return {"type": "regex", "pattern": f"[\\s\\S]{{{bounds}}}"}
        return {"type": "any_text", "excludes": [PARAMETER_CLOSE]}
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE}


def _raw_string(schema: dict[str, Any]) -> bool:
    if schema.get("type") == "string":
        return True
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return values is not None and "type" not in schema and all(isinstance(v, str) for v in values)


def _tags(tools: ToolPolicy) -> list[dict[str, Any]]:
    index = {t.name: i for i, t in enumerate(tools.tools)}
    return [_call_tag(t, index[t.name], tools.tools_param) for t in tools.callable()]


def _calls_format(tools: ToolPolicy) -> dict[str, Any]:
    """Calls only: one or more (exactly one when parallel calls are off or a function is
    named in OpenAI style)."""
    tags = _tags(tools)
    single = not tools.parallel or tools.choice == "named"
    if single and len(tags) == 1:
        return tags[0]
    return {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": TOOL_CALL_SEPARATOR,
        "at_least_one": True,
        "stop_after_first": single,
    }


def _auto_calls_format(tools: ToolPolicy) -> dict[str, Any]:
    """Free text, or calls once the model opens one."""
    return {
        "type": "triggered_tags",
        "triggers": [TOOL_CALL_TRIGGER],
        "tags": _tags(tools),
        "stop_after_first": not tools.parallel,
    }


def check_strict_parameters(schema: Any, param: str) -> None:
    """strict:true argument schemas: an object root with additionalProperties:false and no
    top-level string/non-string unions (Qwen's raw parameter text cannot tell them apart)."""
    check_schema(schema, param)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise schema_error(
            "unsupported", "a strict tool's parameters must be a `type: object` schema", param, ""
        )
    for key in ("enum", "const", "anyOf", "oneOf"):
        if key in schema:
            raise schema_error(
                "unsupported",
                f"a strict tool's parameter root cannot use `{key}`",
                param,
                f"/{key}",
            )
    if schema.get("additionalProperties", True) is not False:
        raise schema_error(
            "unsupported",
            "a strict tool's parameters need `additionalProperties: false`",
            param,
            "/additionalProperties" if "additionalProperties" in schema else "",
        )
    for name, sub in (schema.get("properties") or {}).items():
        declared = sub.get("type") if isinstance(sub, dict) else None
        if isinstance(declared, list) and "string" in declared and len(declared) > 1:
            raise schema_error(
                "unsupported",
                f"parameter `{name}` mixes string with other types, which raw parameter text "
                "cannot distinguish",
                param,
                f"/properties/{name}/type",
            )


def bind_to_generation(
    spec: GrammarSpec,
    generation: GenerationRequest,
    *,
    thinking_on: bool,
    tokenizer: Any,
    prefill: str = "",
) -> GrammarSpec | None:
    """Checks the generation fields a constraint excludes and sets where it starts: with
    thinking on, after the model's `</think>` (reasoning is never constrained); after an
    assistant prefill, the grammar covers the prefill text plus the generated suffix. None
    when the constraint is optional and cannot apply here."""
    if generation.ignore_eos:
        raise invalid("constrained output ends at the model's EOS; drop `ignore_eos`", "ignore_eos")
    if generation.min_tokens:
        raise invalid("`min_tokens` cannot be combined with an output constraint", "min_tokens")
    generation.constraint_prefix = prefill
    if not thinking_on:
        return spec
    lookup = getattr(tokenizer, "token_to_id", None)
    think_end = lookup(THINK_END) if lookup is not None else None
    if think_end is None and not spec.required:
        return None
    if think_end is None:
        raise invalid(
            "this model's thinking cannot be told apart from its answer; disable thinking for "
            "constrained output",
            "enable_thinking",
        )
    generation.constraint_start_after = think_end
    # The reasoning split needs a line break after `</think>`; Qwen writes two.
    return dataclasses.replace(spec, lead=THINK_LEAD)


# --- compile errors ------------------------------------------------------------------------


# The library prefixes its messages with a time and its own source location.
_LIBRARY_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def compile_error(spec: GrammarSpec, reason: str) -> ApiError:
    """The 400 for a source the grammar library rejected."""
    messages = {
        "invalid_grammar": "the GBNF grammar does not parse",
        "invalid_regex": "the regex is not supported",
        "invalid_choice": "the choices cannot be compiled",
        "invalid_json_schema": "the JSON Schema cannot be compiled",
        "unsupported_json_schema": "the JSON Schema cannot be enforced",
    }
    message = messages.get(spec.error_code, "the constraint cannot be compiled")
    reason = _LIBRARY_LOCATION.sub("", reason).strip()
    return ApiError(400, f"{message}: {reason}", code=spec.error_code, param=spec.param)


def observation(stats: dict[str, Any] | None, *, branch: str) -> dict[str, Any] | None:
    """The constraint observation of a settled request (None when unconstrained)."""
    if stats is None:
        return None
    return {
        "branch": branch,
        "complete": bool(stats.get("complete")),
        "terminated": bool(stats.get("terminated")),
        "cache": stats.get("cache", "built"),
        "mask_positions": int(stats.get("mask_positions", 0)),
        "mask_upload_bytes": int(stats.get("mask_upload_bytes", 0)),
        "timings_seconds": {
            "prepare": float(stats.get("prepare_seconds", 0.0)),
            "mask": float(stats.get("mask_seconds", 0.0)),
            "matcher": float(stats.get("matcher_seconds", 0.0)),
        },
    }


async def compile_constraint(engine: Any, spec: GrammarSpec) -> Any:
    """Compiles `spec` on a worker thread (never on the event loop: a new schema takes tens
    of milliseconds); a source the library rejects becomes its 400. None when the engine has
    no grammar support and the constraint is optional."""
    compile_grammar = getattr(engine, "compile_constraint", None)
    if compile_grammar is None:
        if not spec.required:
            return None
        raise unsupported(spec.param, "this engine cannot enforce output constraints")
    try:
        return await asyncio.to_thread(compile_grammar, spec.kind, spec.source, spec.lead)
    except ValueError as e:
        raise compile_error(spec, str(e)) from None


def observed_branch(spec: GrammarSpec, *, has_calls: bool, has_content: bool) -> str:
    if has_calls and "tools" in spec.branches:
        return "tools"
    if has_content and "content" in spec.branches:
        return "content"
    return "undecided"
