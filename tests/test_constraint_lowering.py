"""The shared constraint lowering (protocols/constraints.py): request checks, schema subset
errors with JSON Pointers, and the grammars it builds, run through the core's matcher over a
character vocabulary so that each accepted or rejected text is exact."""

from __future__ import annotations

import pytest

from ninfer.engine_types import GenerationRequest
from ninfer.protocols.constraints import (
    OutputConstraint,
    ToolPolicy,
    bind_to_generation,
    check_regex,
    gbnf_literal,
    lower_constraints,
    parse_response_format,
    parse_structured_outputs,
    single_output_constraint,
)
from ninfer.protocols.conversation import ToolDefinition
from ninfer.protocols.json_schema_subset import check_schema
from ninfer.server.errors import ApiError

_core = pytest.importorskip("ninfer._core")

CHARS = [chr(c).encode() for c in range(32, 127)] + [b"\n", b"\t", "é".encode()]
EOS = len(CHARS)
VOCAB = [*CHARS, b"<eos>"]
ZONE = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}, "n": {"type": "integer"}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [ToolDefinition("get_time", parameters=ZONE, strict=True), ToolDefinition("free")]


@pytest.fixture(scope="module")
def compiler():
    return _core.GrammarCompiler(VOCAB, len(VOCAB), stop_ids=[EOS])


def accepts(compiler, spec, text: str) -> bool:
    matcher = _core.ConstraintMatcher(compiler.compile(spec.kind, spec.source), len(VOCAB))
    return all(matcher.accept(VOCAB.index(ch.encode())) for ch in text) and matcher.complete


def error_of(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **kwargs)
    return info.value


CALL = (
    "<tool_call>\n<function=get_time>\n<parameter=zone>\n{zone}\n</parameter>\n"
    "{more}</function>\n</tool_call>"
)


def call(zone="utc", more=""):
    return CALL.format(zone=zone, more=more)


def test_required_calls_are_exact_qwen_xml(compiler):
    spec = lower_constraints(None, ToolPolicy(TOOLS, choice="required"))
    assert spec.kind == "structural_tag" and spec.branches == ("tools",)
    assert accepts(compiler, spec, call())
    assert accepts(compiler, spec, call(more="<parameter=n>\n-4\n</parameter>\n"))
    assert accepts(compiler, spec, call() + "\n" + call("cet"))  # parallel calls
    assert not accepts(compiler, spec, call("utc\t"))  # no stray whitespace in raw values
    assert not accepts(compiler, spec, "hi " + call())  # required: calls start at once
    assert not accepts(compiler, spec, call(more="<parameter=x>\n1\n</parameter>\n"))
    free = (
        "<tool_call>\n<function=free>\n<parameter=q>\nany text\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert accepts(compiler, spec, free)  # non-strict: framing and name only
    assert not accepts(compiler, spec, free.replace("=free>", "=other>"))


def test_single_call_and_named(compiler):
    single = lower_constraints(None, ToolPolicy(TOOLS, choice="required", parallel=False))
    assert accepts(compiler, single, call())
    assert not accepts(compiler, single, call() + "\n" + call())
    named = lower_constraints(
        None, ToolPolicy(TOOLS, choice="named", allowed=frozenset({"get_time"}))
    )
    assert accepts(compiler, named, call("cet"))
    assert not accepts(compiler, named, call() + "\n" + call())
    # Anthropic's named tool: one or more calls to it.
    anthropic = lower_constraints(
        None, ToolPolicy(TOOLS, choice="required", allowed=frozenset({"get_time"}))
    )
    assert accepts(compiler, anthropic, call() + "\n" + call())


def test_auto_allows_text_then_calls_and_json_or_calls(compiler):
    auto = lower_constraints(None, ToolPolicy(TOOLS))
    assert auto.branches == ("content", "tools") and not auto.required
    assert accepts(compiler, auto, "plain answer")
    assert accepts(compiler, auto, "let me check " + call())
    assert lower_constraints(None, ToolPolicy(TOOLS[1:], constraints="auto")) is None
    assert lower_constraints(None, ToolPolicy(TOOLS, choice="none")) is None
    json_or_calls = lower_constraints(OutputConstraint("json_object", "f"), ToolPolicy(TOOLS))
    assert accepts(compiler, json_or_calls, '{"a":[1,true]}')
    assert accepts(compiler, json_or_calls, call())
    assert not accepts(compiler, json_or_calls, "plain answer")


def test_choice_literals_are_escaped(compiler):
    choices = ['say "hi"', "back\\slash", "", "é\n"]
    spec = lower_constraints(parse_structured_outputs({"choice": choices}), None)
    for choice in choices:
        assert accepts(compiler, spec, choice)
    assert not accepts(compiler, spec, "say hi")
    assert gbnf_literal('a"\\\t') == '"a\\"\\\\\\t"'


def test_regex_anchors_and_rejections(compiler):
    spec = lower_constraints(parse_structured_outputs({"regex": "^ab|cd$"}), None)
    assert accepts(compiler, spec, "ab") and accepts(compiler, spec, "cd")
    assert not accepts(compiler, spec, "abcd")
    for bad in ["(?<=a)b", "(?!a)", "\\B", "\\P{L}", "(?m)a", "\\2", "\\k<n>", "\\z", "("]:
        assert error_of(check_regex, bad, "r").code == "invalid_regex", bad
    for good in ["[\\w.-]+@x\\.com", "\\d{2,3}", "[^\\]]", "\\u00e9|\\x41", "(?:a|b)*"]:
        check_regex(good, "r")


def test_request_rules():
    json_out = OutputConstraint("json_object", "response_format")
    error = error_of(lower_constraints, json_out, None, stop_strings=["x"])
    assert (error.code, error.param) == ("conflicting_constraints", "stop")
    error = error_of(lower_constraints, None, ToolPolicy(TOOLS), stop_strings=["x"])
    assert error.param == "stop"
    plain = ToolPolicy(TOOLS[1:], constraints="auto")
    assert lower_constraints(None, plain, stop_strings=["x"]) is None
    strict = ToolPolicy(TOOLS, constraints="auto")  # strict arguments are still enforced
    assert error_of(lower_constraints, None, strict, stop_strings=["x"]).param == "stop"
    regex = OutputConstraint("regex", "structured_outputs.regex", text="a")
    error = error_of(lower_constraints, regex, ToolPolicy(TOOLS))
    assert error.param == "structured_outputs.regex"
    assert lower_constraints(regex, ToolPolicy(TOOLS, choice="none")).kind == "regex"
    error = error_of(single_output_constraint, json_out, regex)
    assert error.code == "conflicting_constraints"


@pytest.mark.parametrize(
    ("schema", "code", "pointer"),
    [
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "invalid",
         "/properties/a/type"),
        ({"$ref": "#/$defs/missing"}, "invalid", "/$ref"),
        ({"$ref": "https://example.com/s.json"}, "unsupported", "/$ref"),
        ({"type": "string", "minLength": -1}, "invalid", "/minLength"),
        ({"not": {"type": "string"}}, "unsupported", "/not"),
        ({"items": {"if": {}}}, "unsupported", "/items/if"),
        ({"type": "number", "multipleOf": 0.5}, "unsupported", "/multipleOf"),
        ({"type": "string", "format": "color"}, "unsupported", "/format"),
        ({"type": "integer", "minimum": -(2**63) - 1}, "unsupported", "/minimum"),
        ({"enum": []}, "unsatisfiable", "/enum"),
        ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "unsatisfiable",
         "/exclusiveMaximum"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "unsatisfiable", "/maxItems"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "unsatisfiable",
         "/required/0"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "unsatisfiable", "/allOf"),
        ({"$defs": {"a/b": {"type": "nope"}}}, "invalid", "/$defs/a~1b/type"),
    ],
)  # fmt: skip
def test_schema_errors_name_the_pointer(schema, code, pointer):
    error = error_of(check_schema, schema, "text.format.schema")
    assert error.code == f"{code}_json_schema"
    assert error.param == "text.format.schema" + pointer


def test_supported_schema_passes_and_formats_parse():
    schema = {
        "$defs": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "type": "object",
        "properties": {
            "pos": {"type": "array", "prefixItems": [{"$ref": "#/$defs/n"}], "items": False},
            "x": {"type": ["number", "null"], "exclusiveMaximum": 1.5},
            "s": {"type": "string", "pattern": "^[a-z]+$", "format": "email"},
            "u": {"anyOf": [{"const": 1}, {"allOf": [{"type": "number"}, {"type": "integer"}]}]},
        },
        "required": ["pos"],
        "title": "ignored",
    }
    check_schema(schema, "f")
    flat = parse_response_format(
        {"type": "json_schema", "schema": schema}, "text.format", nested=False
    )
    assert flat.schema_param == "text.format.schema"
    nested = parse_response_format(
        {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}},
        "response_format",
        nested=True,
    )
    assert nested.strict and nested.schema_param == "response_format.json_schema.schema"
    assert parse_response_format({"type": "text"}, "response_format", nested=True) is None


def test_strict_tool_parameter_rules():
    loose = ToolDefinition("t", parameters={"type": "object", "properties": {}}, strict=True)
    error = error_of(lower_constraints, None, ToolPolicy([loose], choice="required"))
    assert error.code == "unsupported_json_schema" and error.param == "tools[0].function.parameters"
    union = ToolDefinition(
        "t",
        parameters={
            "type": "object",
            "properties": {"a": {"type": ["string", "null"]}},
            "additionalProperties": False,
        },
        strict=True,
    )
    error = error_of(lower_constraints, None, ToolPolicy([union], choice="required"))
    assert error.param == "tools[0].function.parameters/properties/a/type"


class _Tokenizer:
    def token_to_id(self, token: str) -> int | None:
        return {"</think>": 77}.get(token)


def test_bind_to_generation_starts_after_thinking():
    spec = lower_constraints(OutputConstraint("json_object", "response_format"), None)
    generation = GenerationRequest(prompt_ids=[1], max_tokens=8)
    bound = bind_to_generation(spec, generation, thinking_on=True, tokenizer=_Tokenizer())
    assert generation.constraint_start_after == 77 and bound.lead == "\n\n"
    plain = GenerationRequest(prompt_ids=[1], max_tokens=8)
    assert bind_to_generation(spec, plain, thinking_on=False, tokenizer=None) is spec
    assert plain.constraint_start_after == -1
    error = error_of(bind_to_generation, spec, plain, thinking_on=True, tokenizer=object())
    assert error.param == "enable_thinking"
    eos_free = GenerationRequest(prompt_ids=[1], max_tokens=8, ignore_eos=True)
    error = error_of(bind_to_generation, spec, eos_free, thinking_on=False, tokenizer=None)
    assert error.param == "ignore_eos"
