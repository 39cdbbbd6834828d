"""Shared pieces of the structured-output tests: a random-weight Qwen3.5 artifact with the
real 248k tokenizer (so every valid output is valid by construction of the grammar mask, not
by the model), the schemas and tools they constrain to, and a server over it."""

from __future__ import annotations

from typing import Any

from ninfer.engine_types import EngineConfig
from server_harness import start_server

MODEL = "tiny-qwen"
CONFIG = dict(
    architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
    linear_value_head_dim=16, vocab_size=248320, mtp_num_hidden_layers=0,
    layer_types=["linear_attention", "full_attention"],
)  # fmt: skip
VOCAB_ROWS = 248320
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
        "scores": {
            "type": "array",
            "prefixItems": [{"type": "boolean"}],
            "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "kind", "scores"],
    "additionalProperties": False,
}
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"enum": ["utc", "cet"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOL_PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}


def open_engine(tmp_path_factory: Any) -> Any:
    from ninfer.convert.random import make_random_artifact
    from ninfer.engine import AsyncEngine

    path = make_random_artifact(CONFIG, tmp_path_factory.mktemp("art") / "q.ninfer", seed=7,
                                name=MODEL)  # fmt: skip
    config = EngineConfig(max_concurrency=2, max_context=1024, prefill_chunk=256,
                          max_pending_requests=8, threads=1)  # fmt: skip
    return AsyncEngine.open(path, config)


def start_constrained_server(tmp_path_factory: Any, engine: Any = None, **kwargs: Any) -> Any:
    engine = engine if engine is not None else open_engine(tmp_path_factory)
    return start_server(engine, default_max_tokens=96, **kwargs)
