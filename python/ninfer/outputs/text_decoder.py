"""Incremental UTF-8 decoding of the engine's committed bytes.

Engine events may split a character across events; the decoder holds the incomplete tail
until the rest arrives, and only the final flush turns a truncated sequence into U+FFFD.
"""

from __future__ import annotations

import codecs


class IncrementalTextDecoder:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
