"""Checks every JSON request body passes before it is decoded, whatever route reads it.

msgspec validates UTF-8 and escapes only in the fields a route's struct decodes; bytes inside
a skipped field (`metadata`, `user`, an unknown key) are never looked at, and a lone UTF-16
surrogate escape is reported as "Input data was truncated". A body is JSON text, so it must be
UTF-8 as a whole and every `\\u` escape must name a Unicode scalar value: both are checked
here, once, in `HttpRequest.read_body`, so each route (and each route still to come) refuses
them the same way with a message that says what is wrong and where.
"""

from __future__ import annotations

import re

from ninfer.server.errors import ApiError

# A high-low surrogate pair of escapes (an astral character: emoji), or any one surrogate
# escape. Pairs are by far the common case and are skipped as a whole; the literal `\u`
# prefix lets the regex engine scan ahead quickly.
_SURROGATE_ESCAPES = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)
_BACKSLASH = 0x5C


def _lone_surrogate(body: bytes) -> tuple[int, str] | None:
    """Offset and text of the first `\\u` escape naming an unpaired surrogate, if any."""
    for match in _SURROGATE_ESCAPES.finditer(body):
        at, end = match.span()
        if end - at == 12:
            continue  # a pair
        backslashes = 0
        while at - backslashes - 1 >= 0 and body[at - backslashes - 1] == _BACKSLASH:
            backslashes += 1
        if backslashes % 2 == 0:  # else `\\uD800`: an escaped backslash, then plain text
            return at, match.group().decode("ascii")
    return None


def check_json_text(body: bytes) -> None:
    """Raise a 400 `invalid_json` unless `body` is UTF-8 without lone surrogate escapes."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(
                400,
                f"request body is not valid UTF-8: byte 0x{body[exc.start]:02x} at offset "
                f"{exc.start} ({exc.reason})",
                code="invalid_json",
            ) from None
    if b"\\u" not in body:
        return
    lone = _lone_surrogate(body)
    if lone is not None:
        at, escape = lone
        raise ApiError(
            400,
            f"request body is not valid JSON: the escape `{escape}` at offset {at} is an "
            "unpaired UTF-16 surrogate, which encodes no character (pair a high "
            "\\uD800-\\uDBFF escape with a low \\uDC00-\\uDFFF one)",
            code="invalid_json",
        )
