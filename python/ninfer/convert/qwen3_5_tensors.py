"""Where each artifact tensor of a Qwen3.5/3.6 model comes from in a Hugging Face checkpoint.

Released checkpoints are multimodal (model spec §5.1): the decoder under
`model.language_model.*`, the vision tower under `model.visual.*` (skipped: the artifact holds
the text model), `lm_head.weight` and the MTP head under `mtp.*` at the top level. Text-only
exports use `model.*`. MoE experts are stored either stacked (`mlp.experts.gate_up_proj`
[E, 2·ff, H] and `mlp.experts.down_proj` [E, H, ff]) or per expert
(`mlp.experts.{e}.{gate,up,down}_proj.weight`); the artifact always uses the stacked form,
so per-expert tensors are planned as a stack (gate and up concatenated per expert).

`plan_qwen3_5_tensors` only looks at names and shapes; `materialize` builds one artifact
tensor from a reader of checkpoint tensors, so a converter streams one tensor at a time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ninfer.convert.qwen3_5_config import qwen3_5_expected_tensors

TEXT_PREFIXES = ("model.language_model.", "model.")
VISION_PREFIXES = ("model.visual.", "visual.")
_PER_EXPERT = re.compile(
    r"^(?P<layer>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$"
)


class CheckpointLayoutError(ValueError):
    """The checkpoint's tensor names or shapes do not match the config."""


@dataclass(frozen=True)
class Direct:
    """The artifact tensor is checkpoint tensor `name`, unchanged."""

    name: str


@dataclass(frozen=True)
class StackedExperts:
    """Stack over experts (axis 0) of, per expert, its `parts` concatenated along axis 0."""

    parts: tuple[tuple[str, ...], ...]


Source = Direct | StackedExperts


@dataclass
class TensorPlan:
    sources: dict[str, Source]  # artifact name → source, in artifact order
    skipped_vision: list[str] = field(default_factory=list)  # reported to the user, not stored


def artifact_name(checkpoint_name: str) -> str | None:
    """The artifact (text-model) name of a checkpoint tensor, or None for a vision tensor."""
    if checkpoint_name.startswith(VISION_PREFIXES):
        return None
    for prefix in TEXT_PREFIXES:
        if checkpoint_name.startswith(prefix):
            return "model." + checkpoint_name[len(prefix) :]
    return checkpoint_name  # lm_head.weight, mtp.*


def plan_qwen3_5_tensors(
    shapes: Mapping[str, tuple[int, ...]], config: dict[str, Any]
) -> TensorPlan:
    """Map every artifact tensor of `config` to its checkpoint source and check shapes.

    shapes: checkpoint tensor name → shape. Raises CheckpointLayoutError naming the first
    missing, duplicated, unexpected or mis-shaped tensors.
    """
    expected = qwen3_5_expected_tensors(config)
    by_artifact: dict[str, str] = {}
    per_expert: dict[str, dict[tuple[int, str], str]] = {}  # "<layer>.mlp.experts" → parts
    plan = TensorPlan(sources={})
    unexpected: list[str] = []
    for name in shapes:
        target = artifact_name(name)
        if target is None:
            plan.skipped_vision.append(name)
            continue
        match = _PER_EXPERT.match(target)
        if match:
            key = (int(match["e"]), match["proj"])
            per_expert.setdefault(match["layer"], {})[key] = name
            continue
        if target in by_artifact:
            raise CheckpointLayoutError(f"{by_artifact[target]} and {name} both give {target}")
        if target not in expected:
            unexpected.append(name)
        by_artifact[target] = name
    if unexpected:
        raise CheckpointLayoutError(f"unexpected tensors {unexpected[:5]}")
    experts = config.get("num_experts", 0)
    for layer, parts in per_expert.items():
        wanted = {(e, p) for e in range(experts) for p in ("gate", "up", "down")}
        if set(parts) != wanted:
            missing = sorted(wanted - set(parts))[:3]
            extra = sorted(set(parts) - wanted)[:3]
            raise CheckpointLayoutError(
                f"{layer}: per-expert tensors incomplete (missing {missing}, extra {extra})"
            )
        for stacked in (layer + ".gate_up_proj", layer + ".down_proj"):
            if stacked in by_artifact:
                raise CheckpointLayoutError(f"{stacked} is stored both stacked and per expert")
        plan.sources[layer + ".gate_up_proj"] = StackedExperts(
            tuple((parts[(e, "gate")], parts[(e, "up")]) for e in range(experts))
        )
        plan.sources[layer + ".down_proj"] = StackedExperts(
            tuple((parts[(e, "down")],) for e in range(experts))
        )
    for target, name in by_artifact.items():
        plan.sources[target] = Direct(name)
    missing = [n for n in expected if n not in plan.sources]
    if missing:
        raise CheckpointLayoutError(f"checkpoint lacks tensors {missing[:5]}")
    plan.sources = {n: plan.sources[n] for n in expected}  # artifact order
    for target, source in plan.sources.items():
        got = _source_shape(source, shapes)
        if got != tuple(expected[target]):
            raise CheckpointLayoutError(
                f"{target}: checkpoint gives shape {list(got)}, config implies "
                f"{list(expected[target])}"
            )
    return plan


def _source_shape(source: Source, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    if isinstance(source, Direct):
        return tuple(shapes[source.name])
    first = [tuple(shapes[n]) for n in source.parts[0]]
    for expert in source.parts:
        if [tuple(shapes[n]) for n in expert] != first:
            return (-1,)  # experts disagree: reported as a shape mismatch
    rows = sum(s[0] for s in first)
    return (len(source.parts), rows, *first[0][1:])


def materialize(source: Source, read: Callable[[str], np.ndarray]) -> np.ndarray:
    """The artifact tensor for `source`, reading checkpoint tensors with `read`."""
    if isinstance(source, Direct):
        return read(source.name)
    return np.stack([np.concatenate([read(n) for n in expert], axis=0) for expert in source.parts])


def checkpoint_names(plan: TensorPlan) -> Iterable[str]:
    """Every checkpoint tensor the plan reads."""
    for source in plan.sources.values():
        if isinstance(source, Direct):
            yield source.name
        else:
            for expert in source.parts:
                yield from expert
