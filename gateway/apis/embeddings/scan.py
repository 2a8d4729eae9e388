"""The worker's embeddings answer, bounded and scanned without parsing it whole
(spec §21: a 60 MB answer must not cost a gigabyte). Pure.

The answer may be at most what the request can legitimately produce (inputs
times the widest vector times the longest float text, plus an envelope); one pass
over the held bytes finds the envelope, the ``data`` array and each vector,
parses each vector alone and drops it, so the array can go back to the caller
as the worker's own bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.errors import GatewayError
from gateway.core.sse import violation

#: the widest vector an answer may carry: the gateway refuses ``dimensions``,
#: so the worker serves its model's own; twice the widest the simulator makes
#: (8192) and above the common widths (768 to 4096; 12288 for the widest)
MAX_DIMENSIONS = 16_384
#: the longest JSON text of one float and its comma: ``-2.2250738585072014e-308,``
FLOAT_TEXT_BYTES = 25
#: a data entry's bytes besides its vector (``{"object":"embedding",...,"index":n}``)
_ENTRY_BYTES = 256
#: the envelope's bytes besides the data entries (``object``, ``model``, ``usage``)
_ENVELOPE_BYTES = 65_536
#: what an entry may hold besides its vector (keys, ``index``, unknown fields)
_ENTRY_BUDGET = 1024
#: the longest key
_KEY_BYTES = 256


def vector_bound(*, base64_vectors: bool) -> int:
    """The most bytes of one vector's JSON: :data:`MAX_DIMENSIONS` floats' text
    in brackets, or their float32 bytes' base64 in quotes."""
    if base64_vectors:
        return 4 * -(-4 * MAX_DIMENSIONS // 3) + 2
    return MAX_DIMENSIONS * FLOAT_TEXT_BYTES + 2


def answer_bound(inputs: int, *, base64_vectors: bool) -> int:
    """The most bytes an embeddings answer for ``inputs`` inputs can legitimately hold."""
    return inputs * (vector_bound(base64_vectors=base64_vectors) + _ENTRY_BYTES) + _ENVELOPE_BYTES


_WS = re.compile(rb"[ \t\n\r]*+")
#: a JSON string's extent (orjson checks its escapes and UTF-8 when it is parsed)
_STRING = re.compile(rb'"(?:[^"\\]++|\\[\s\S])*+"')
#: what lies between a container's strings and brackets
_PLAIN = re.compile(rb'[^"\[\]{}]*+')
#: a number or a literal's extent (orjson checks which, if either)
_SCALAR = re.compile(rb"[-+.0-9A-Za-z]++")
#: an array with no string and no nested container: up to its first ``]``
_FLAT_ARRAY = re.compile(rb"\[[^\]]*+\]")
#: the characters of an array of JSON numbers (orjson checks the grammar)
_NUMBERS = re.compile(rb"\[[-+.0-9eE, \t\n\r]*+\]")
_QUOTE, _COLON, _COMMA = 0x22, 0x3A, 0x2C
_OPEN_ARRAY, _CLOSE_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT = 0x5B, 0x5D, 0x7B, 0x7D
_OPENERS, _CLOSERS = (_OPEN_ARRAY, _OPEN_OBJECT), (_CLOSE_ARRAY, _CLOSE_OBJECT)


def _skip_ws(view: memoryview, pos: int, end: int) -> int:
    found = _WS.match(view, pos, end)
    assert found is not None  # it matches the empty string
    return found.end()


def _not_json() -> GatewayError:
    return violation("Upstream answer is not valid JSON.")


def _parse(view: memoryview, start: int, end: int) -> Any:
    try:
        return orjson.loads(view[start:end])
    except (ValueError, RecursionError):
        raise _not_json() from None


class _Scan:
    """One pass over a whole answer held in ``view``: where each part lies.

    Only the structure is walked here (strings, brackets, commas); every value
    is then parsed by orjson, the small ones here (within ``left`` bytes in
    all), the vectors one at a time by the dialect."""

    __slots__ = ("end", "left", "vector_bytes", "view")

    def __init__(self, view: memoryview, budget: int, vector_bytes: int) -> None:
        self.view = view
        self.end = len(view)
        self.left = budget
        self.vector_bytes = vector_bytes

    def ws(self, pos: int) -> int:
        pos = _skip_ws(self.view, pos, self.end)
        if pos >= self.end:
            raise _not_json()
        return pos

    def expect(self, pos: int, char: int) -> int:
        if self.view[pos] != char:
            raise _not_json()
        return self.ws(pos + 1)

    def string_end(self, pos: int) -> int:
        found = _STRING.match(self.view, pos, self.end)
        if found is None:
            raise _not_json()
        return found.end()

    def key(self, pos: int, seen: set[str]) -> tuple[str, int]:
        """The key at ``pos`` and where its value starts; a key seen twice is refused."""
        if self.view[pos] != _QUOTE:
            raise _not_json()
        limit = min(self.end, pos + min(_KEY_BYTES, self.left))
        found = _STRING.match(self.view, pos, limit)
        if found is None:
            raise self._over(limit)
        end = found.end()
        self.left -= end - pos
        key = _parse(self.view, pos, end)
        if key in seen:
            raise violation("Upstream embeddings answer repeats a key.")
        seen.add(key)
        return key, self.expect(self.ws(end), _COLON)

    def small(self, pos: int, budget: int | None = None) -> tuple[Any, int]:
        """The value at ``pos``, parsed, and where it ends; counted against the budget."""
        limit = min(self.end, pos + (self.left if budget is None else min(budget, self.left)))
        first = self.view[pos]
        if first == _QUOTE:
            found = _STRING.match(self.view, pos, limit)
            if found is None:
                raise self._over(limit)
            end = found.end()
        elif first in _OPENERS:
            end = self._container_end(pos, limit)
        else:
            found = _SCALAR.match(self.view, pos, limit)
            if found is None:
                raise self._over(limit) if limit < self.end else _not_json()
            end = found.end()
        self.left -= end - pos
        return _parse(self.view, pos, end), end

    def _container_end(self, pos: int, limit: int) -> int:
        view, depth, at = self.view, 0, pos
        while at < limit:
            char = view[at]
            if char == _QUOTE:
                found = _STRING.match(view, at, limit)
                if found is None:
                    break
                at = found.end()
            elif char in _OPENERS:
                depth += 1
                at += 1
            elif char in _CLOSERS:
                depth -= 1
                at += 1
                if depth == 0:
                    return at
            else:
                plain = _PLAIN.match(view, at, limit)
                assert plain is not None  # it matches the empty string
                at = plain.end()
        raise self._over(limit)

    def _over(self, limit: int) -> GatewayError:
        if limit < self.end:
            return violation("Upstream embeddings answer holds too much besides its vectors.")
        return _not_json()

    def vector_end(self, pos: int) -> int:
        """Where the vector at ``pos`` ends (C-speed for an array of numbers or a
        string), within :func:`vector_bound`: one vector is parsed whole later."""
        first = self.view[pos]
        if first != _OPEN_ARRAY and first != _QUOTE:
            return self.small(pos, _ENTRY_BUDGET)[1]
        limit = min(self.end, pos + self.vector_bytes)
        found = (_FLAT_ARRAY if first == _OPEN_ARRAY else _STRING).match(self.view, pos, limit)
        if found is not None:
            return found.end()
        if limit < self.end:
            raise violation("Upstream embedding is longer than any model's.")
        raise _not_json()


@dataclass(slots=True)
class _Entry:
    """One data entry: its fields but the vector (parsed), the vector's extent."""

    fields: dict[str, Any]
    vector: tuple[int, int] | None


@dataclass(slots=True)
class EmbeddingsAnswer:
    """A scanned answer. ``fields`` are the envelope's in the worker's order, the
    ``data`` array's value left out when it is an array (its bytes are
    ``data``, its entries ``entries``, their vector extents relative to it)."""

    fields: list[tuple[str, Any]]
    data: bytes | None = None
    entries: list[_Entry] | None = None


_DATA = object()  # where the data array stands among the envelope's fields


def _scan_entries(scan: _Scan, pos: int, most: int) -> tuple[list[_Entry], int]:
    """The data array at ``pos``: its entries (at most ``most``) and its end."""
    entries: list[_Entry] = []
    at = scan.ws(pos + 1)
    if scan.view[at] == _CLOSE_ARRAY:
        return entries, at + 1
    while True:
        if scan.view[at] != _OPEN_OBJECT:
            raise violation("Upstream embedding entry is malformed.")
        if len(entries) == most:
            raise violation("Upstream embeddings answer has the wrong number of entries.")
        entry = _Entry({}, None)
        seen: set[str] = set()
        at = scan.ws(at + 1)
        if scan.view[at] != _CLOSE_OBJECT:
            while True:
                key, at = scan.key(at, seen)
                if key == "embedding":
                    end = scan.vector_end(at)
                    entry.vector = (at, end)
                else:
                    entry.fields[key], end = scan.small(at, _ENTRY_BUDGET)
                at = scan.ws(end)
                if scan.view[at] == _COMMA:
                    at = scan.ws(at + 1)
                    continue
                if scan.view[at] != _CLOSE_OBJECT:
                    raise _not_json()
                break
        entries.append(entry)
        at = scan.ws(at + 1)
        if scan.view[at] == _COMMA:
            at = scan.ws(at + 1)
            continue
        if scan.view[at] != _CLOSE_ARRAY:
            raise _not_json()
        return entries, at + 1


def scan_answer(
    view: memoryview, *, entries: int, budget: int, vector_bytes: int
) -> tuple[EmbeddingsAnswer, int, int]:
    """The answer in ``view``, and the extent of its data array (``0, 0`` if none)."""
    scan = _Scan(view, budget, vector_bytes)
    answer = EmbeddingsAnswer([])
    span = (0, 0)
    at = _skip_ws(view, 0, len(view))
    if at >= len(view) or view[at] != _OPEN_OBJECT:
        raise violation("Upstream embeddings answer is not a list object.")
    at = scan.ws(at + 1)
    seen: set[str] = set()
    if view[at] != _CLOSE_OBJECT:
        while True:
            key, at = scan.key(at, seen)
            if key == "data" and view[at] == _OPEN_ARRAY:
                answer.entries, end = _scan_entries(scan, at, entries)
                answer.fields.append((key, _DATA))
                span = (at, end)
            else:
                value, end = scan.small(at)
                answer.fields.append((key, value))
            at = scan.ws(end)
            if view[at] == _COMMA:
                at = scan.ws(at + 1)
                continue
            if view[at] != _CLOSE_OBJECT:
                raise _not_json()
            break
    if _skip_ws(view, at + 1, len(view)) != len(view):
        raise _not_json()
    return answer, *span
