"""Template options of one request: chat_template_kwargs merged with the typed fields.

Every protocol (Chat Completions, Responses, Anthropic Messages) resolves its thinking,
preservation and effort options through `resolve_template_options`, so the agreement rules
are the same everywhere:

* kwargs pass to the template; the server's own variables (messages, tools, the generation
  mode, the tokenizer's special tokens) cannot be overridden through them;
* kwargs that repeat a request field of their own (`add_generation_prompt`,
  `continue_final_message`) and kwargs named like a Jinja built-in (`range`, `tojson`, ...,
  but not `raise_exception`) are dropped: the request field and the built-in win;
* a typed field and the same-named kwarg must agree when both are set
  (`conflicting_template_option`); null and "auto" (and "default" for the effort) mean unset;
* `reasoning_effort: "none"` means thinking off; any other effort conflicts with an explicit
  `enable_thinking: false`, and is replaced by the nearest value the template accepts;
* request options override the server defaults (--no-thinking, --preserve-thinking);
  options nobody set are not template variables at all, so the template's defaults apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.prompt.chat_template import JINJA_BUILTIN_NAMES, ChatTemplate, TemplateError

STANDARD_OPTIONS = ("enable_thinking", "preserve_thinking", "reasoning_effort")
# Values the renderer itself supplies; a kwarg may not replace them.
RESERVED_KEYS = frozenset(
    {
        "messages",
        "tools",
        "chat_template",
        "tokenize",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "documents",
    }
)
# Ordered from least to most effort; "none" is thinking off and handled separately.
# Request fields of their own; the field always wins, so the kwarg is ignored, not refused.
FIELD_OWNED_KEYS = frozenset({"add_generation_prompt", "continue_final_message"})
EFFORT_LEVELS = ("minimal", "low", "medium", "high", "xhigh", "max")
_UNSET_EFFORTS = ("auto", "default")


class TemplateOptionError(Exception):
    """A kwarg or typed option the request may not combine; `param` names the field."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(slots=True)
class TemplateOptions:
    """What a request asked for; None = unset. `kwargs_field` names the kwargs object."""

    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None
    kwargs: Mapping[str, Any] | None = None
    kwargs_field: str = "chat_template_kwargs"
    typed_fields: Mapping[str, str] = field(default_factory=dict)  # option -> request field


@dataclass(slots=True)
class ResolvedOptions:
    template_kwargs: dict[str, Any]  # what the template receives
    thinking_disabled: bool  # enable_thinking is explicitly false after resolution
    requested_effort: str | None  # as the client asked (for logs)


@dataclass(frozen=True, slots=True)
class EffortLadder:
    """The reasoning_effort values a template renders, found by trying each once at load."""

    accepted: tuple[str, ...] = EFFORT_LEVELS

    @classmethod
    def probe(cls, template: ChatTemplate) -> EffortLadder:
        chat = [{"role": "user", "content": "hi"}]
        try:
            template.render(chat, add_generation_prompt=True)
        except TemplateError:
            return cls()  # cannot judge: keep every request's own value (and its error)
        accepted = []
        for level in EFFORT_LEVELS:
            try:
                template.render(
                    chat, add_generation_prompt=True, template_kwargs={"reasoning_effort": level}
                )
            except TemplateError:
                continue
            accepted.append(level)
        return cls(tuple(accepted) if accepted else EFFORT_LEVELS)

    def nearest(self, level: str) -> str:
        """The accepted value nearest to `level` (ties round up); unknown values unchanged."""
        if level in self.accepted or level not in EFFORT_LEVELS:
            return level
        want = EFFORT_LEVELS.index(level)
        ranked = sorted(
            self.accepted,
            key=lambda a: (abs(EFFORT_LEVELS.index(a) - want), -EFFORT_LEVELS.index(a)),
        )
        return ranked[0]


def resolve_template_options(
    options: TemplateOptions,
    server_defaults: Mapping[str, Any],
    ladder: EffortLadder,
) -> ResolvedOptions:
    kwargs = {
        key: value
        for key, value in (options.kwargs or {}).items()
        if key not in FIELD_OWNED_KEYS and key not in JINJA_BUILTIN_NAMES
    }
    for name in ("enable_thinking", "preserve_thinking"):
        if kwargs.get(name) == "auto":
            kwargs[name] = None  # "auto" is unset, like null
    where = options.kwargs_field
    for key in kwargs:
        if key in RESERVED_KEYS:
            raise TemplateOptionError(
                f"`{key}` is supplied by the server and cannot be set through {where}",
                f"{where}.{key}",
            )
    requested = options.reasoning_effort
    if requested is not None and requested not in (*EFFORT_LEVELS, "none", *_UNSET_EFFORTS):
        raise TemplateOptionError(
            f"unknown reasoning_effort `{requested}`; expected none, " + ", ".join(EFFORT_LEVELS),
            _field(options, "reasoning_effort"),
        )
    typed = {
        "enable_thinking": options.enable_thinking,
        "preserve_thinking": options.preserve_thinking,
        "reasoning_effort": _effort_or_none(options.reasoning_effort),
    }
    if "reasoning_effort" in kwargs:
        kwargs["reasoning_effort"] = _effort_or_none(kwargs["reasoning_effort"])
    chosen: dict[str, Any] = {}
    for name in STANDARD_OPTIONS:
        typed_value, kwarg_value = typed[name], kwargs.pop(name, None)
        if typed_value is not None and kwarg_value is not None and typed_value != kwarg_value:
            raise TemplateOptionError(
                f"`{name}` is {_show(typed_value)} at the top level but {_show(kwarg_value)} "
                f"in {where}",
                f"{where}.{name}",
                "conflicting_template_option",
            )
        value = typed_value if typed_value is not None else kwarg_value
        if value is not None:
            chosen[name] = value
    for name in ("enable_thinking", "preserve_thinking"):
        if name in chosen and not isinstance(chosen[name], bool):
            raise TemplateOptionError(f"`{name}` must be a boolean", _field(options, name))
    effort = chosen.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise TemplateOptionError(
            "`reasoning_effort` must be a string", _field(options, "reasoning_effort")
        )
    if effort == "none":
        if chosen.get("enable_thinking") is True:
            raise TemplateOptionError(
                "reasoning_effort `none` disables thinking but enable_thinking is true",
                _field(options, "reasoning_effort"),
                "conflicting_template_option",
            )
        del chosen["reasoning_effort"]
        chosen["enable_thinking"] = False
    elif effort is not None:
        if chosen.get("enable_thinking") is False:
            raise TemplateOptionError(
                f"reasoning_effort `{effort}` asks for thinking but enable_thinking is false",
                _field(options, "reasoning_effort"),
                "conflicting_template_option",
            )
        chosen["reasoning_effort"] = ladder.nearest(effort)
    merged: dict[str, Any] = dict(server_defaults)
    if effort is not None and effort != "none":
        merged.pop("enable_thinking", None)  # an effort request implies thinking
    merged.update(kwargs)  # ordinary kwargs: null stays None
    merged.update(chosen)
    if merged.get("reasoning_effort") == "none":
        merged.pop("reasoning_effort")
        merged["enable_thinking"] = False
    return ResolvedOptions(
        template_kwargs=merged,
        thinking_disabled=merged.get("enable_thinking") is False,
        requested_effort=effort,
    )


def string_leaves(value: Any) -> Iterable[str]:
    """Every string inside a JSON-like value (keys included), for literal-text encoding."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from string_leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from string_leaves(item)


def _effort_or_none(value: Any) -> Any:
    return None if value in _UNSET_EFFORTS else value


def _field(options: TemplateOptions, name: str) -> str:
    return options.typed_fields.get(name, f"{options.kwargs_field}.{name}")


def _show(value: Any) -> str:
    return "`true`" if value is True else "`false`" if value is False else f"`{value}`"
