"""Request fields that every OpenAI-style generation body shares, checked by msgspec.

Chat Completions and legacy Completions subclass `GenerationFields`, so a range or type error
names the same field the same way on both endpoints, and `sampling_fields()` is the one place
that hands the sampler options to `SamplingPolicy.resolve`.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ninfer.server.errors import unsupported

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# Every integer field is bounded: JSON allows any magnitude, msgspec decodes it exactly, and
# an unbounded value (2**70 max_tokens) would otherwise be clamped silently somewhere below.
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
UnitFloat = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
TopK = Annotated[int, msgspec.Meta(ge=0, le=20)]
Seed = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


class GenerationFields(msgspec.Struct, kw_only=True):
    model: str
    temperature: Temperature | None = None
    top_p: UnitFloat | None = None
    top_k: TopK | None = None
    min_p: UnitFloat | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Int64 | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extensions
    ignore_eos: bool | None = None
    min_tokens: NonNegativeInt | None = None
    stop_token_ids: list[NonNegativeInt] | None = None
    return_token_ids: bool | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # accepted only when it asks nothing

    def sampling_fields(self) -> dict[str, Any]:
        """The sampler options as given (None = unset), for SamplingPolicy.resolve."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }


def check_mm_processor_kwargs(kwargs: dict[str, Any] | None) -> None:
    """vLLM's multimodal processor options: commonly sent empty or all-null, and then accepted;
    a value that would change preprocessing is refused rather than silently ignored."""
    for key, value in (kwargs or {}).items():
        if value is not None:
            raise unsupported(
                f"mm_processor_kwargs.{key}",
                "multimodal processor options are not applied by this server "
                "(only an empty object or null values are accepted)",
            )
