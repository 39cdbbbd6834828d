"""Sampling precedence shared by every protocol.

Artifact generation defaults, then the registered defaults of the architecture for the
request's thinking mode, then process flags, then request fields, then --greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ninfer.engine_types import SamplingParams

SAMPLER_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.name != "seed")
_UINT64 = 1 << 64


def seed_to_engine(seed: int) -> int:
    """Signed wire seeds map one-to-one onto the engine's unsigned 64-bit seed space."""
    return seed % _UINT64


def artifact_sampling_defaults(generation: dict) -> dict[str, float | int]:
    """The sampler values a model's generation_config.json asks for (known keys only)."""
    defaults: dict[str, float | int] = {}
    for name in SAMPLER_FIELDS:
        value = generation.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            defaults[name] = value
    if generation.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return defaults


# Registered defaults (Qwen3.6 model cards): temperature/top-p/top-k/min-p/presence penalty,
# by thinking mode. The MoE (35B-A3B) differs only in its thinking presence penalty.
_QWEN3_6_THINKING = {
    "temperature": 1.0,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
_QWEN3_6_INSTRUCT = {
    "temperature": 0.7,
    "top_p": 0.80,
    "top_k": 20,
    "min_p": 0.0,
    "presence_penalty": 1.5,
    "frequency_penalty": 0.0,
}
ARCHITECTURE_PRESETS: dict[str, dict[bool, dict[str, float | int]]] = {
    "qwen3_5": {True: _QWEN3_6_THINKING, False: _QWEN3_6_INSTRUCT},
    "qwen3_5_moe": {True: {**_QWEN3_6_THINKING, "presence_penalty": 1.5}, False: _QWEN3_6_INSTRUCT},
}


def architecture_sampling_presets(header: dict) -> dict[bool, dict[str, float | int]]:
    """Registered sampler defaults of the artifact's architecture, keyed by thinking mode."""
    return ARCHITECTURE_PRESETS.get(str(header.get("architecture") or ""), {})


@dataclass(slots=True)
class SamplingPolicy:
    artifact_defaults: dict[str, float | int] = field(default_factory=dict)
    architecture_presets: dict[bool, dict[str, float | int]] = field(default_factory=dict)
    process_overrides: dict[str, float | int] = field(default_factory=dict)
    process_seed: int | None = None
    greedy: bool = False

    def resolve(
        self,
        request_fields: dict[str, float | int | None],
        seed: int | None,
        *,
        thinking: bool = True,
    ) -> SamplingParams:
        params = SamplingParams()
        preset = self.architecture_presets.get(thinking, {})
        for layer in (self.artifact_defaults, preset, self.process_overrides, request_fields):
            for name, value in layer.items():
                if value is not None:
                    setattr(params, name, value)
        chosen_seed = seed if seed is not None else self.process_seed
        params.seed = None if chosen_seed is None else seed_to_engine(chosen_seed)
        if params.top_p == 0.0:
            params.temperature = 0.0  # an empty nucleus keeps only the argmax token
        if self.greedy:
            params.temperature = 0.0
        return params
