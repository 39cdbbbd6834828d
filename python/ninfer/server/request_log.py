"""--request-log-jsonl: one JSON object per line, appended and flushed per event, rotated by size.

Each file a reader may pick up begins with this server's `server_start` record (the same
bytes in every file), so a rotated file can be read on its own; a reader combining files
counts one start per `server_instance_id`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("ninfer.server")

SCHEMA = "ninfer_serve_request_log"
# The serving spec's schema generation: request_done nests `result` (finish, tokens, cache
# reuse, tool-call parse report, generated ids), `generation` (scheduling, admission),
# `constraint`, `timings_seconds`, `speculative` and `engine_timing` (docs/operations.md).
SCHEMA_VERSION = 26
MAX_KEEP = 1000


class RequestLogError(Exception):
    """The request log cannot be used as configured (startup aborts with this message)."""


def encode_record(record: dict[str, Any]) -> bytes:
    # json keeps floats at full precision (repr); NaN/inf never occur in our records but
    # must not produce invalid JSON if they did.
    return (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


class RequestLog:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        artifact: str | os.PathLike[str] | None = None,
        max_mib: int | None = None,
        keep: int = 4,
    ) -> None:
        if not 0 <= keep <= MAX_KEEP:
            raise RequestLogError(f"--request-log-keep must be 0..{MAX_KEEP}, got {keep}")
        self.path = Path(path)
        self.keep = keep
        self.max_bytes = None if max_mib is None else max_mib << 20
        self._check_names(artifact)
        self._start_line: bytes | None = None
        self._write_failed = False  # warned once until a write succeeds again
        self._file: BinaryIO = self._open()
        self._size = self._file.tell()
        self._rotate_at = self.max_bytes

    def _check_names(self, artifact: str | os.PathLike[str] | None) -> None:
        if not self.path.parent.is_dir():
            raise RequestLogError(
                f"cannot open --request-log-jsonl {self.path}: directory {self.path.parent} "
                "does not exist"
            )
        if artifact is None:
            return
        target = Path(artifact).resolve()
        names = [self.path] + [self._rotated(i) for i in range(1, self.keep + 1)]
        if self.max_bytes is None:
            names = names[:1]
        for name in names:
            if name.resolve() == target:
                raise RequestLogError(
                    f"--request-log-jsonl {self.path} would write over the model artifact "
                    f"({name} is {target})"
                )

    def _open(self) -> BinaryIO:
        try:
            return open(self.path, "ab")  # noqa: SIM115 - held open for the server's lifetime
        except OSError as exc:
            raise RequestLogError(
                f"cannot open --request-log-jsonl {self.path}: {exc.strerror or exc}"
            ) from exc

    def _rotated(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def start(self, record: dict[str, Any]) -> None:
        """Writes `server_start`; it is copied verbatim at the head of every later file."""
        self._start_line = encode_record(record)
        # A file already at the limit is rotated before it is written (and the new file
        # starts with this record); if that fails, carry on in the old one.
        at_limit = self.max_bytes is not None and self._size >= self.max_bytes
        if not (at_limit and self._rotate()):
            self._append(self._start_line)

    def write(self, record: dict[str, Any]) -> None:
        """Appends one record. A write that fails (a full disk) is reported, never raised:
        the request it describes has already been answered."""
        try:
            self._append(encode_record(record))
            if self._rotate_at is not None and self._size >= self._rotate_at:
                self._rotate()
        except (OSError, ValueError, RequestLogError) as exc:
            if not self._write_failed:
                log.warning("cannot write the request log %s: %s", self.path, exc)
            self._write_failed = True
        else:
            self._write_failed = False

    def close(self) -> None:
        self._file.close()

    def _append(self, line: bytes) -> None:
        self._file.write(line)
        self._file.flush()
        self._size += len(line)

    def _rotate(self) -> bool:
        """Starts a new file (beginning with server_start); False when renaming failed."""
        assert self.max_bytes is not None
        self._file.close()
        try:
            self._shift_files()
        except OSError as exc:
            log.warning(
                "cannot rotate the request log %s (%s); appending to it and trying again "
                "after another %d MiB",
                self.path,
                exc.strerror or exc,
                self.max_bytes >> 20,
            )
            self._file = self._open()
            self._size = self._file.tell()
            self._rotate_at = self._size + self.max_bytes
            return False
        self._file = self._open()
        self._size = self._file.tell()
        self._rotate_at = self.max_bytes
        if self._start_line is not None:
            self._append(self._start_line)
        return True

    def _shift_files(self) -> None:
        if self.keep == 0:
            self.path.unlink()
            return
        oldest = self._rotated(self.keep)
        if oldest.exists():
            oldest.unlink()
        for index in range(self.keep - 1, 0, -1):
            source = self._rotated(index)
            if source.exists():
                source.rename(self._rotated(index + 1))
        self.path.rename(self._rotated(1))
