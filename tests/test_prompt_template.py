"""Chat-template rendering: HF helpers, sandboxing, and agreement with transformers."""

from __future__ import annotations

import datetime
import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from ninfer.prompt import ChatTemplate, TemplateError

SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Exercises loop controls, tojson, bos/eos, raise_exception and whitespace control together.
RICH_TEMPLATE = """{{ bos_token }}
{%- for m in messages %}
  {%- if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('role') }}{% endif %}
  {%- if m.content == 'skip' %}{% continue %}{% endif %}
<{{ m.role }}>{{ m.content | trim }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}
{% endfor %}
{%- if meta is defined %}meta={{ meta | tojson }}{% endif %}
{%- if add_generation_prompt %}<assistant>{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Héllo — ünïcode ✓"},
        {"role": "assistant", "content": "  Hi  "},
        {"role": "user", "content": "skip"},
        {"role": "user", "content": "again"},
    ],
]


@pytest.mark.parametrize("source", [SMOLLM_TEMPLATE, RICH_TEMPLATE])
@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers_rendering(source, messages, add_generation_prompt):
    ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
        messages,
        add_generation_prompt=add_generation_prompt,
        template_kwargs={"meta": {"z": "é", "a": [1, 2]}},
    )
    reference = render_jinja_template(
        [messages],
        chat_template=source,
        add_generation_prompt=add_generation_prompt,
        bos_token="<s>",
        eos_token="</s>",
        meta={"z": "é", "a": [1, 2]},
    )
    reference = reference[0][0] if isinstance(reference, tuple) else reference[0]
    assert ours == reference


def test_tojson_keeps_non_ascii_and_member_order():
    template = ChatTemplate("{{ messages[0] | tojson }}", bos_token=None, eos_token=None)
    message = {"role": "user", "content": "ü→✓", "z": 1, "a": {"y": 2, "b": 3}}
    out = template.render([message], add_generation_prompt=False)
    assert out == json.dumps(message, ensure_ascii=False)
    assert list(json.loads(out)) == ["role", "content", "z", "a"]


def test_tojson_indent():
    template = ChatTemplate("{{ {'a': 1} | tojson(indent=2) }}", bos_token=None, eos_token=None)
    assert template.render([], add_generation_prompt=False) == '{\n  "a": 1\n}'


def test_raise_exception_becomes_template_error():
    template = ChatTemplate(
        "{{ raise_exception('no system role allowed') }}", bos_token="", eos_token=""
    )
    with pytest.raises(TemplateError, match="no system role allowed"):
        template.render([{"role": "system", "content": "x"}])


def test_strftime_now_renders_today():
    template = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}", bos_token="", eos_token="")
    before = datetime.date.today().isoformat()
    out = template.render([])
    assert out in (before, datetime.date.today().isoformat())


def test_bos_and_eos_come_from_the_artifact_header():
    header = {"tokenizer": {"bos_token": "<|begin|>", "eos_token": "<|end|>"}}
    template = ChatTemplate.from_header("{{ bos_token }}|{{ eos_token }}", header)
    assert template.render([]) == "<|begin|>|<|end|>"
    missing = ChatTemplate.from_header("[{{ bos_token }}]", {"tokenizer": {"bos_token": None}})
    assert missing.render([]) == "[]"


def test_sandbox_forbids_mutation_and_internals():
    mutate = ChatTemplate("{{ messages.append(1) }}", bos_token="", eos_token="")
    with pytest.raises(TemplateError):
        mutate.render([{"role": "user", "content": "x"}])
    internals = ChatTemplate("{{ messages.__class__.__mro__ }}", bos_token="", eos_token="")
    with pytest.raises(TemplateError):
        internals.render([{"role": "user", "content": "x"}])


def test_syntax_error_is_reported_at_load():
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for x in %}", bos_token="", eos_token="")


def test_add_generation_prompt_switch():
    template = ChatTemplate(SMOLLM_TEMPLATE, bos_token="", eos_token="")
    messages = [{"role": "user", "content": "hi"}]
    with_prompt = template.render(messages, add_generation_prompt=True)
    without = template.render(messages, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
