"""A JSON object's top-level members with the exact text of each value. Pure.

Receipts hash an approval's arguments "as the worker sent them" (spec §24),
and a parse-then-dump would not give those bytes back (number spellings,
escapes, key order). So the object is walked member by member with the
standard decoder's ``raw_decode``, which reports where each value ends: each
key maps to its parsed value and the slice of text it came from. A repeated
key keeps its last value, as ``json.loads`` does; ``NaN`` and ``Infinity``
are not JSON; anything but one object (and whitespace) is a violation.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from gateway.core.sse import violation

__all__ = ["members"]

_WS: Final = re.compile(r"[ \t\n\r]*")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_no_constant)


def members(text: str) -> dict[str, tuple[Any, str]]:
    """A JSON object's top-level members: each key's parsed value and its raw text."""
    try:
        return _members(text)
    except (ValueError, IndexError, RecursionError):
        raise violation("Upstream sent an agentic event that is not a JSON object.") from None


def _skip(text: str, pos: int) -> int:
    """The position after the JSON whitespace at ``pos``."""
    match = _WS.match(text, pos)
    return match.end() if match else pos


def _members(text: str) -> dict[str, tuple[Any, str]]:
    pos = _skip(text, 0)
    if text[pos : pos + 1] != "{":
        raise ValueError
    pos = _skip(text, pos + 1)
    out: dict[str, tuple[Any, str]] = {}
    if text[pos : pos + 1] == "}":
        pos += 1
    else:
        while True:
            if text[pos : pos + 1] != '"':
                raise ValueError
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _skip(text, pos)
            if text[pos : pos + 1] != ":":
                raise ValueError
            start = _skip(text, pos + 1)
            value, end = _DECODER.raw_decode(text, start)
            out[key] = (value, text[start:end])  # a repeated key: the last wins, as json.loads
            pos = _skip(text, end)
            sep, pos = text[pos : pos + 1], pos + 1
            if sep == "}":
                break
            if sep != ",":
                raise ValueError
            pos = _skip(text, pos)
    if _skip(text, pos) != len(text):
        raise ValueError
    return out
