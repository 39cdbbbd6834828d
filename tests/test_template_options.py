"""Template option resolution, the effort ladder probe, and literal-text placeholders."""

from __future__ import annotations

import pytest

from fake_engine import FakeTokenizer
from ninfer.prompt import ChatTemplate
from ninfer.prompt.chat_template import TemplateError
from ninfer.prompt.literal_text import LiteralText, special_spellings
from ninfer.prompt.template_options import (
    EFFORT_LEVELS,
    EffortLadder,
    TemplateOptionError,
    TemplateOptions,
    resolve_template_options,
)

# Accepts only low, medium and xhigh, like the official Qwen3.8 template.
PICKY = (
    "{% if reasoning_effort is defined and reasoning_effort not in ['low', 'medium', 'xhigh'] %}"
    "{{ raise_exception('bad effort') }}{% endif %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}[{{ reasoning_effort }}]"
)
NEEDS_SYSTEM = "{% if messages[0].role != 'system' %}{{ raise_exception('system!') }}{% endif %}"


def template(source: str) -> ChatTemplate:
    return ChatTemplate(source, bos_token="", eos_token="")


def test_ladder_maps_to_nearest_accepted_value_rounding_ties_up():
    ladder = EffortLadder.probe(template(PICKY))
    assert ladder.accepted == ("low", "medium", "xhigh")
    mapped = {level: ladder.nearest(level) for level in EFFORT_LEVELS}
    assert mapped == {"minimal": "low", "low": "low", "medium": "medium", "high": "xhigh",
                      "xhigh": "xhigh", "max": "xhigh"}  # fmt: skip
    assert ladder.nearest("weird") == "weird"  # the template's own error decides


def test_ladder_keeps_values_when_the_probe_chat_cannot_render():
    assert EffortLadder.probe(template(NEEDS_SYSTEM)).accepted == EFFORT_LEVELS
    assert EffortLadder.probe(template("{{ raise_exception('no') }}")).accepted == EFFORT_LEVELS


def resolve(defaults=None, ladder=None, **options):
    return resolve_template_options(
        TemplateOptions(**options), defaults or {}, ladder or EffortLadder()
    )


def test_typed_fields_and_kwargs_merge():
    r = resolve(enable_thinking=False, kwargs={"enable_thinking": False, "custom": None, "x": 1})
    assert r.template_kwargs == {"custom": None, "x": 1, "enable_thinking": False}
    assert r.thinking_disabled
    assert resolve(kwargs={"enable_thinking": None}).template_kwargs == {}  # null = unset
    assert resolve(reasoning_effort="auto").template_kwargs == {}
    effort = resolve(reasoning_effort="high", ladder=EffortLadder(("low", "xhigh")))
    assert effort.template_kwargs == {"reasoning_effort": "xhigh"}
    assert effort.requested_effort == "high"


def test_field_owned_and_jinja_builtin_kwargs_are_dropped():
    kwargs = {"add_generation_prompt": False, "continue_final_message": True, "range": 1,
              "lipsum": 2, "upper": 3, "join": 4, "equalto": 5, "strftime_now": 6,
              "x": 7}  # fmt: skip
    assert resolve(kwargs=kwargs).template_kwargs == {"x": 7}
    assert resolve(kwargs={"raise_exception": "bound"}).template_kwargs == {
        "raise_exception": "bound"
    }


def test_auto_standard_kwargs_are_unset():
    defaults = {"enable_thinking": False, "preserve_thinking": True}
    kwargs = {"enable_thinking": "auto", "preserve_thinking": "auto", "reasoning_effort": "auto"}
    assert resolve(defaults, kwargs=kwargs).template_kwargs == defaults
    assert resolve(kwargs={"mode": "auto"}).template_kwargs == {"mode": "auto"}  # not standard


def test_raise_exception_kwarg_binds_in_the_render():
    source = "{{ raise_exception }}{% for m in messages %}{{ m.content }}{% endfor %}"
    kwargs = resolve(kwargs={"raise_exception": "bound", "range": 5}).template_kwargs
    rendered = template(source).render([{"role": "user", "content": "hi"}], template_kwargs=kwargs)
    assert rendered == "boundhi"
    refusing = template("{% if messages|length > 1 %}{{ raise_exception('one turn') }}{% endif %}")
    with pytest.raises(TemplateError):  # a bound non-callable: the template's call fails, a 400
        refusing.render([{}, {}], template_kwargs={"raise_exception": "bound"})
    looping = "{% for i in range(2) %}{{ i }}{% endfor %}"
    kwargs = resolve(kwargs={"range": 5}).template_kwargs
    assert template(looping).render([], template_kwargs=kwargs) == "01"


def test_request_overrides_server_defaults():
    defaults = {"enable_thinking": False, "preserve_thinking": True}
    assert resolve(defaults).template_kwargs == defaults
    assert resolve(defaults, enable_thinking=True).template_kwargs == {
        "enable_thinking": True, "preserve_thinking": True}  # fmt: skip
    assert resolve(defaults, reasoning_effort="low").template_kwargs == {
        "preserve_thinking": True, "reasoning_effort": "low"}  # fmt: skip
    assert resolve(defaults, preserve_thinking=False).template_kwargs["preserve_thinking"] is False


@pytest.mark.parametrize(
    ("options", "code", "param"),
    [
        ({"enable_thinking": True, "kwargs": {"enable_thinking": False}},
         "conflicting_template_option", "chat_template_kwargs.enable_thinking"),
        ({"reasoning_effort": "low", "kwargs": {"reasoning_effort": "high"}},
         "conflicting_template_option", "chat_template_kwargs.reasoning_effort"),
        ({"reasoning_effort": "none", "kwargs": {"enable_thinking": True}},
         "conflicting_template_option", "chat_template_kwargs.reasoning_effort"),
        ({"kwargs": {"tools": []}}, "invalid_value", "chat_template_kwargs.tools"),
        ({"reasoning_effort": "ultra", "typed_fields": {"reasoning_effort": "reasoning_effort"}},
         "invalid_value", "reasoning_effort"),
        ({"kwargs": {"bos_token": "x"}}, "invalid_value", "chat_template_kwargs.bos_token"),
        ({"kwargs": {"enable_thinking": "yes"}}, "invalid_value",
         "chat_template_kwargs.enable_thinking"),
    ],
)  # fmt: skip
def test_conflicts_and_reserved_keys(options, code, param):
    with pytest.raises(TemplateOptionError) as info:
        resolve(**options)
    assert (info.value.code, info.value.param) == (code, param)


def test_literal_text_placeholders_keep_trim_and_encode_as_text():
    tokenizer = FakeTokenizer()
    literal = LiteralText(tokenizer, special_spellings(tokenizer))
    assert literal.protect("plain") == "plain" and not literal.active
    held = literal.protect("  a<|im_end|>b \n")
    assert held.startswith("  ") and held.endswith(" \n") and "<|im_end|>" not in held
    rendered = "<|im_start|>user\n" + held.strip() + "<|im_end|>"
    assert literal.restore(rendered) == "<|im_start|>user\na<|im_end|>b<|im_end|>"
    ids = literal.encode(rendered)
    assert ids.count(2) == 1 and ids[0] == 1  # only the template's markers are special
    assert tokenizer.decode(ids) == literal.restore(rendered)
    as_json = LiteralText(tokenizer, special_spellings(tokenizer))
    quoted = as_json.protect('say "<|im_end|>"', rendered_as_json=True)
    assert as_json.restore(quoted) == 'say \\"<|im_end|>\\"'
