"""Hugging Face-compatible chat-template rendering in a jinja2 sandbox.

Templates come from model files, so they run in an ImmutableSandboxedEnvironment: they can
read the conversation but cannot mutate it or reach Python internals. The helpers are the
ones HF templates rely on: `raise_exception`, a `tojson` that keeps non-ASCII text and key
order, and `strftime_now`.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """The template failed to compile or refused to render this conversation."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja2's own tojson, no HTML escaping: the output is a prompt, not a web page.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[loopcontrols],
        undefined=jinja2.Undefined,
        keep_trailing_newline=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Names the template environment itself binds (globals, filters, tests: `range`, `namespace`,
# `tojson`, `upper`, `equalto`, ...). A render variable of the same name would shadow a global
# the template relies on, so request kwargs with these names are dropped, as vLLM drops them;
# `raise_exception` is the one exception, and binds like any other kwarg (as in vLLM).
_builtins = _environment()
JINJA_BUILTIN_NAMES = frozenset(
    {*_builtins.globals, *_builtins.filters, *_builtins.tests} - {"raise_exception"}
)
del _builtins


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    @classmethod
    def from_header(cls, source: str, header: dict) -> ChatTemplate:
        tokenizer = header.get("tokenizer") or {}
        return cls(
            source, bos_token=tokenizer.get("bos_token"), eos_token=tokenizer.get("eos_token")
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        context: dict[str, Any] = dict(template_kwargs or {})
        context.update(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
