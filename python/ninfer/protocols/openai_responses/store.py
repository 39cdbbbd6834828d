"""The local Response store: an LRU bounded by record count and by bytes.

Stored Responses live in this process only. A record keeps the terminal Response object,
the canonical input Items of its request (for input_items), and the whole Item history a
child continues from (its parent's history, its own input, its own output). Histories of a
chain share their Item objects, so the byte bound charges each record its own envelope,
input and output (their JSON size), not the shared prefix. Deleting or evicting a record
only ends its retrieval and continuation: a stored child keeps its own history.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from ninfer.server.errors import ApiError

DEFAULT_MAX_RECORDS = 1024
DEFAULT_MAX_MIB = 256

_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the terminal wire object
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]  # every Item a continuation renders, oldest first
    preserve_thinking: bool | None  # the resolved value a child inherits when it sets none
    size: int = 0

    def measure(self) -> int:
        self.size = len(_encoder.encode(self.response)) + len(_encoder.encode(self.input_items))
        return self.size


class ResponseStore:
    def __init__(
        self, max_records: int = DEFAULT_MAX_RECORDS, max_mib: int = DEFAULT_MAX_MIB
    ) -> None:
        self.max_records = max_records
        self.max_bytes = max_mib << 20
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def get(self, response_id: str) -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is not None:
            self._records.move_to_end(response_id)
        return record

    def put(self, record: StoredResponse) -> None:
        """Keep `record`, evicting the least recently used ones; refuse one that can never fit."""
        size = record.measure()
        if size > self.max_bytes:
            raise ApiError(
                400,
                f"this Response needs {size} bytes of store but the store holds at most "
                f"{self.max_bytes} bytes (--response-store-max-mib); repeat the request with "
                "store: false or start the server with a larger store",
                code="response_store_capacity_exceeded",
                param="store",
            )
        self.delete(record.id)
        while self._records and (
            len(self._records) >= self.max_records or self.bytes + size > self.max_bytes
        ):
            _, evicted = self._records.popitem(last=False)
            self.bytes -= evicted.size
        self._records[record.id] = record
        self.bytes += size

    def delete(self, response_id: str) -> bool:
        record = self._records.pop(response_id, None)
        if record is None:
            return False
        self.bytes -= record.size
        return True


def response_not_found(response_id: str, param: str | None = None) -> ApiError:
    shown = response_id.encode("ascii", "backslashreplace").decode()[:80]
    return ApiError(
        404,
        f"no stored Response with id `{shown}` (it was never stored, was created with "
        "store: false, was deleted, or was evicted from the local store)",
        code="response_not_found",
        param=param,
    )
