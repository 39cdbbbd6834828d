"""The thinking-block signature: `ninfer-reasoning.v1:` + Base64 of the reasoning text.

Not encrypted or authenticated (a local, trusted server): it lets a client that shows no
thinking text (`thinking.display: "omitted"`) hand the reasoning back with the block it
echoes, so the replayed prompt is the one the visible text would give.
"""

from __future__ import annotations

import base64
import binascii

from ninfer.server.errors import ApiError

PREFIX = "ninfer-reasoning.v1:"


def sign(reasoning: str) -> str:
    return PREFIX + base64.b64encode(reasoning.encode()).decode("ascii")


def restore(signature: object, where: str) -> str | None:
    """The reasoning an NInfer signature carries; None for any other signature."""
    if not isinstance(signature, str) or not signature.startswith(PREFIX):
        return None
    try:
        raw = base64.b64decode(signature[len(PREFIX) :], validate=True)
        return raw.decode("utf-8")
    except (binascii.Error, ValueError):
        raise ApiError(
            400,
            "the thinking signature starts with `ninfer-reasoning.v1:` but is not Base64 of "
            "UTF-8 text",
            code="invalid_thinking_signature",
            param=where,
        ) from None
