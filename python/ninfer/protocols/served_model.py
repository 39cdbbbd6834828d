"""What every protocol needs to know about the one model this process serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.prompt import ChatTemplate
from ninfer.prompt.template_options import EffortLadder
from ninfer.protocols.sampling import (
    SamplingPolicy,
    architecture_sampling_presets,
    artifact_sampling_defaults,
)
from ninfer.protocols.thinking_budget import ThinkingClose


@dataclass(frozen=True, slots=True)
class OutputMarkup:
    """Which Qwen output markup the served template speaks (decided once, at load)."""

    reasoning: bool = False  # `<think>` ... `</think>`
    tool_calls: bool = False  # `<tool_call>` XML function calls
    think_end_token_id: int | None = None  # the `</think>` control token, when there is one

    @classmethod
    def detect(cls, template_source: str, tokenizer: Any) -> OutputMarkup:
        token_to_id = getattr(tokenizer, "token_to_id", None)
        think_end = token_to_id("</think>") if callable(token_to_id) else None
        return cls(
            reasoning="<think>" in template_source,
            tool_calls="<tool_call>" in template_source,
            think_end_token_id=think_end if isinstance(think_end, int) else None,
        )


@dataclass(slots=True)
class ServedModel:
    engine: Any  # ninfer.engine.AsyncEngine or a test double with the same contract
    public_id: str
    template: ChatTemplate
    sampling: SamplingPolicy
    default_max_tokens: int
    template_defaults: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking
    effort_ladder: EffortLadder = field(default_factory=EffortLadder)
    markup: OutputMarkup = field(default_factory=OutputMarkup)
    tolerant_tool_calls: bool = False
    default_thinking_budget: int | None = None  # --default-thinking-budget
    thinking_close: ThinkingClose | None = None  # what a reached cap commits
    max_output_tokens: int | None = None  # --max-output-tokens: every request's output ceiling

    @property
    def max_context(self) -> int:
        return int(self.engine.max_context)

    def cap_output(self, tokens: int) -> int:
        """A request's output budget under the process-wide ceiling (`length` when it binds)."""
        if self.max_output_tokens is None:
            return tokens
        return min(tokens, self.max_output_tokens)


def public_model_id(header: dict, override: str | None) -> str:
    """The alias clients must send: --model-id, else metadata.name, else the architecture."""
    if override:
        return override
    name = (header.get("metadata") or {}).get("name")
    return name or str(header.get("architecture") or "model")


class ModelSetupError(Exception):
    """The model cannot be served as configured (reported at startup, before binding)."""


def load_served_model(
    engine: Any,
    *,
    model_id: str | None = None,
    chat_template: str | None = None,
    process_sampling: dict[str, float | int] | None = None,
    process_seed: int | None = None,
    greedy: bool = False,
    default_max_tokens: int = 8192,
    no_thinking: bool = False,
    preserve_thinking: bool = False,
    reasoning_effort: str | None = None,
    tolerant_tool_calls: bool = False,
    default_thinking_budget: int | None = None,
    thinking_budget_message: str | None = None,
    max_output_tokens: int | None = None,
) -> ServedModel:
    header = engine.header
    source = chat_template if chat_template is not None else engine.chat_template()
    if not source:
        raise ModelSetupError("the artifact has no chat template; pass --chat-template FILE")
    try:
        template = ChatTemplate.from_header(source, header)
    except Exception as exc:
        raise ModelSetupError(str(exc)) from exc
    defaults: dict[str, Any] = {}
    if no_thinking:
        defaults["enable_thinking"] = False
    if preserve_thinking:
        defaults["preserve_thinking"] = True
    ladder = EffortLadder.probe(template)
    if reasoning_effort == "none":
        defaults["enable_thinking"] = False
    elif reasoning_effort is not None:
        defaults["reasoning_effort"] = ladder.nearest(reasoning_effort)
    return ServedModel(
        engine=engine,
        public_id=public_model_id(header, model_id),
        template=template,
        sampling=SamplingPolicy(
            artifact_defaults=artifact_sampling_defaults(header.get("generation") or {}),
            architecture_presets=architecture_sampling_presets(header),
            process_overrides=dict(process_sampling or {}),
            process_seed=process_seed,
            greedy=greedy,
        ),
        default_max_tokens=default_max_tokens,
        template_defaults=defaults,
        effort_ladder=ladder,
        markup=OutputMarkup.detect(source, engine.tokenizer),
        tolerant_tool_calls=tolerant_tool_calls,
        default_thinking_budget=default_thinking_budget,
        thinking_close=ThinkingClose.build(engine.tokenizer, thinking_budget_message),
        max_output_tokens=max_output_tokens,
    )
