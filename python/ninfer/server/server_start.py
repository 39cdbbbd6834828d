"""The request log's `server_start` record: what this process serves, and how it was started."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from pathlib import Path
from typing import Any

from ninfer import __version__
from ninfer.engine_types import EngineConfig
from ninfer.protocols.served_model import ServedModel
from ninfer.server.telemetry import Telemetry

REDACTED = "<redacted>"
_SECRET_FLAGS = ("--api-key",)


def redacted_argv(argv: list[str]) -> list[str]:
    """argv with every secret flag's value replaced (both `--flag V` and `--flag=V`)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in _SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif arg.partition("=")[0] in _SECRET_FLAGS and "=" in arg:
            out.append(arg.partition("=")[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


def server_start_record(
    telemetry: Telemetry,
    args: argparse.Namespace,
    artifact: Path,
    served: ServedModel,
    config: EngineConfig,
) -> dict[str, Any]:
    engine = served.engine
    info = dict(engine.model_info)
    stats = dict(engine.stats()) if callable(getattr(engine, "stats", None)) else {}
    policy = served.sampling
    record = telemetry.base("server_start")
    record.update(
        ninfer_version=__version__,
        pid=os.getpid(),
        artifact=str(artifact.resolve()),
        architecture=info.get("architecture"),
        public_name=served.public_id,
        formats={"weights": info.get("ftype"), "kv": info.get("kv_dtype", "bf16")},
        model={key: info.get(key) for key in ("n_vocab", "n_ctx_train", "n_embd", "n_params")},
        engine=dataclasses.asdict(config)
        | {
            "max_context": served.max_context,
            "kv_pages": stats.get("kv_pages_total"),
            "kv_capacity_tokens": stats.get("kv_capacity_tokens"),  # the resolved shared pool
        },
        sampler_defaults={
            "artifact": policy.artifact_defaults,
            "thinking": policy.architecture_presets.get(True, {}),
            "non_thinking": policy.architecture_presets.get(False, {}),
            "process_overrides": policy.process_overrides,
            "process_seed": policy.process_seed,
            "greedy": policy.greedy,
        },
        default_max_tokens=served.default_max_tokens,
        template_defaults=served.template_defaults,
        environment=_environment(config.device),
        argv=redacted_argv(list(getattr(args, "argv", []))),
    )
    return record


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        from ninfer import _core

        count = getattr(_core, "cuda_device_count", None)
        env["cuda_device_count"] = int(count()) if callable(count) else 0
    except ImportError:
        env["cuda_device_count"] = None
    return env
