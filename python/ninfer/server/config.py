"""HTTP-layer settings of one server process (the engine has its own EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass

KEEP_ALIVE_SECONDS = 5.0


@dataclass(slots=True)
class AppConfig:
    api_key: str | None = None
    cors: bool = False
    max_request_mib: int = 384
    keep_alive_s: float = KEEP_ALIVE_SECONDS  # SSE comment after this much silence
    usage_chunk_choice: bool = False  # a zero-delta choice on the streamed usage chunk
    backend: str = ""  # the engine's device, for ninfer_model_info

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib << 20
