"""Plain chunks: the worker's common chunk checked and re-framed on its text alone. Pure.

Nearly every chunk of a stream is the chunk before it with other text: the
same id, created and model, one choice, no finish, no usage, no tool call.
The grammar (``grammar.py``) learns that shape from a chunk it parsed and
checked in full, as two strings around the text's value
(:func:`text_parts`), when the worker wrote it exactly as orjson writes it.
A later event that is those two strings around a :func:`plain_text` is then
that chunk with that text -- the same object the parse would give, so the
same checks would pass -- and is validated without parsing it. The dialect
frames it by the same splice over its own template (the gateway's id and
alias, usage as asked), byte for byte what ``orjson.dumps`` of the edited
object would be: orjson writes a string with no ``"``, ``\\`` or control
character as its UTF-8, and nothing else in the object changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["Lazy", "plain_text", "spliced_text", "text_parts", "with_text"]


class Lazy:
    """A worker event's JSON object, parsed from its bytes (``raw``) only when
    first read. A plain event (validated on its text alone) is given no
    object: until somebody reads :attr:`data` it is :attr:`plain`, and a
    dialect frames it by splicing its text into a learned frame."""

    __slots__ = ("_data", "_loads", "_raw")

    def __init__(
        self,
        data: dict[str, Any] | None,
        raw: str = "",
        loads: Callable[[bytes | str], Any] | None = None,
    ) -> None:
        self._data = data
        self._raw = raw
        self._loads = loads

    @property
    def data(self) -> dict[str, Any]:
        data = self._data
        if data is None:
            assert self._loads is not None
            data = self._data = self._loads(self._raw)
        return data

    @property
    def plain(self) -> bool:
        """Validated on its text and not parsed since: its frame may be spliced."""
        return self._data is None

    def _shown(self) -> str:
        # never parses: reading ``data`` in a repr would change how it is framed
        return repr(self._data) if self._data is not None else f"<plain {self._raw!r}>"


def spliced_text(data: str, head: str, tail: str) -> str | None:
    """``t`` when ``data`` is ``head + t + tail`` with a :func:`plain_text`
    ``t``: then ``data`` is the learned JSON with ``t`` as its text, and parses
    to the learned object with that text. None: check ``data`` in full."""
    if not (data.startswith(head) and data.endswith(tail)):
        return None
    end = len(data) - len(tail)
    if end < len(head):
        return None
    text = data[len(head) : end]
    return text if plain_text(text) else None


def plain_text(text: str) -> bool:
    """Whether ``text`` is written in JSON as itself: no ``"``, ``\\`` or
    control character (what a JSON writer must escape). Three scans in C,
    cheaper than a loop even compiled: a printable text has no control
    character (nor a few rarer ones a JSON writer need not escape, U+2028 or
    DEL: those texts take the full path)."""
    return text.isprintable() and '"' not in text and "\\" not in text


def with_text(obj: dict[str, Any], chat: bool, text: str) -> dict[str, Any]:
    """A copy of the chunk ``obj`` (one choice, checked) with ``text`` as its
    text: a chat delta's ``content``, a completion choice's ``text``."""
    choice = dict(obj["choices"][0])
    if chat:
        delta = dict(choice["delta"])
        delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text
    copy = dict(obj)
    copy["choices"] = [choice]
    return copy


def text_parts(obj: dict[str, Any], chat: bool) -> tuple[str, str] | None:
    """(head, tail): orjson's JSON of the chunk ``obj`` before and after its
    text's value, so that ``head + t + tail`` is its JSON with text ``t`` for
    any :func:`plain_text` ``t``; None when orjson cannot write ``obj``."""
    try:
        empty = orjson.dumps(with_text(obj, chat, "")).decode()
        probe = orjson.dumps(with_text(obj, chat, "x")).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer past 64 bits
        return None
    # The text is one of the empty strings: the one where "x" went in. Two
    # places cannot both fit (the quote after the first is no "x").
    at = empty.find('""')
    while at >= 0:
        cut = at + 1
        if probe == empty[:cut] + "x" + empty[cut:]:
            return empty[:cut], empty[cut:]
        at = empty.find('""', cut)
    return None
