"""Sampling precedence shared by every protocol.

Artifact generation defaults, then process flags, then request fields, then --greedy.
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


@dataclass(slots=True)
class SamplingPolicy:
    artifact_defaults: dict[str, float | int] = field(default_factory=dict)
    process_overrides: dict[str, float | int] = field(default_factory=dict)
    process_seed: int | None = None
    greedy: bool = False

    def resolve(
        self, request_fields: dict[str, float | int | None], seed: int | None
    ) -> SamplingParams:
        params = SamplingParams()
        for layer in (self.artifact_defaults, self.process_overrides, request_fields):
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
