"""What every protocol needs to know about the one model this process serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.prompt import ChatTemplate
from ninfer.protocols.sampling import SamplingPolicy, artifact_sampling_defaults


@dataclass(slots=True)
class ServedModel:
    engine: Any  # ninfer.engine.AsyncEngine or a test double with the same contract
    public_id: str
    template: ChatTemplate
    sampling: SamplingPolicy
    default_max_tokens: int
    template_defaults: dict[str, Any] = field(default_factory=dict)  # e.g. enable_thinking

    @property
    def max_context(self) -> int:
        return int(self.engine.max_context)


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
    return ServedModel(
        engine=engine,
        public_id=public_model_id(header, model_id),
        template=template,
        sampling=SamplingPolicy(
            artifact_defaults=artifact_sampling_defaults(header.get("generation") or {}),
            process_overrides=dict(process_sampling or {}),
            process_seed=process_seed,
            greedy=greedy,
        ),
        default_max_tokens=default_max_tokens,
        template_defaults=defaults,
    )
