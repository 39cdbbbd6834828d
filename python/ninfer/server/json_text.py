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

# A `\uD800`..`\uDBFF` escape not followed by a `\uDC00`..`\uDFFF` one, or a low-surrogate
# escape not preceded by a high one. `(?<!\\)(?:\\\\)*` makes the backslash before `u` an
# escape of its own rather than the second half of an escaped backslash (`"\\ud800"`).
_HIGH = rb"[dD][89abAB][0-9a-fA-F]{2}"
_LOW = rb"[dD][c-fC-F][0-9a-fA-F]{2}"
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*(?P<escape>\\u" + _HIGH + rb"(?!\\u" + _LOW + rb")"
    rb"|(?<!\\u" + _HIGH + rb")\\u" + _LOW + rb")"
)


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
    lone = _LONE_SURROGATE.search(body)
    if lone is not None:
        escape = lone.group("escape").decode("ascii")
        raise ApiError(
            400,
            f"request body is not valid JSON: the escape `{escape}` at offset "
            f"{lone.start('escape')} is an unpaired UTF-16 surrogate, which encodes no "
            "character (pair a high \\uD800-\\uDBFF escape with a low \\uDC00-\\uDFFF one)",
            code="invalid_json",
        )
