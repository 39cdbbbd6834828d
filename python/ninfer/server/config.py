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
    response_store_max_records: int = 1024  # the local Responses store (LRU) ...
    response_store_max_mib: int = 256  # ... and its byte budget
    backend: str = ""  # the engine's device, for ninfer_model_info
    token_count_capacity: int = 17  # token counts at once (max_concurrency + max_pending)

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib << 20
