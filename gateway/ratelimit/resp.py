"""RESP2, sans-I/O: commands to bytes, bytes to replies (the limits store's wire).

Theory of operation
-------------------

:func:`encode` spells one command as an array of bulk strings. A
:class:`ReplyParser` takes bytes as they arrive (``feed``, any split) and
hands out whole replies in order (``next_reply``): simple strings as
``str``, integers as ``int``, bulk strings as ``bytes``, a null as ``None``,
arrays as ``list``, and error replies as :class:`RespError` *values* (the
caller decides whether one is a failure: ``NOSCRIPT`` is not). EOF is data:
``feed_eof`` with a partial reply buffered is a :class:`RespProtocolError`.

Every buffer is capped: a line at ``max_line`` bytes, a bulk string at
``max_bulk``, an array at ``max_items`` entries and ``max_depth`` levels,
and the unparsed input at ``max_buffer``; past a cap, or on a byte that is
not RESP2, the parser raises :class:`RespProtocolError` and is done (the
connection must close). The store's replies are a few hundred bytes, so the
defaults are generous. Pure: no I/O library is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Union

__all__ = ["Reply", "ReplyParser", "RespError", "RespProtocolError", "encode", "encode_parts"]

Reply = Union[str, int, bytes, None, "RespError", list["Reply"]]


class RespError(Exception):
    """An error reply (``-ERR ...``, ``-NOSCRIPT ...``, ``-WRONGPASS ...``)."""

    @property
    def code(self) -> str:
        """The error's first word (``ERR``, ``NOSCRIPT``, ``OOM``, ``WRONGPASS``)."""
        return str(self).split(" ", 1)[0]


class RespProtocolError(ConnectionError):
    """Bytes that are not RESP2, or a reply over a cap: the connection is unusable."""


def _bulk(part: bytes | str | int | float) -> bytes:
    if isinstance(part, str):
        data = part.encode("utf-8")
    elif isinstance(part, bytes):
        data = part
    elif type(part) is int:  # not bool
        data = b"%d" % part
    elif isinstance(part, float):
        data = repr(part).encode("ascii")  # shortest round-trip form
    else:
        raise TypeError(f"not a command argument: {type(part).__name__}")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def encode_parts(parts: Iterable[bytes | str | int | float]) -> bytes:
    """Arguments as bulk strings, without the array header (to cache a command's prefix)."""
    return b"".join([_bulk(p) for p in parts])


def encode(*parts: bytes | str | int | float) -> bytes:
    """One command as a RESP2 array of bulk strings."""
    if not parts:
        raise ValueError("a command needs a name")
    return b"*%d\r\n%s" % (len(parts), encode_parts(parts))


class _Incomplete(Exception):
    pass


class ReplyParser:
    def __init__(
        self,
        *,
        max_line: int = 65_536,
        max_bulk: int = 1 << 20,
        max_items: int = 65_536,
        max_depth: int = 8,
        max_buffer: int = 4 << 20,
    ) -> None:
        self._buf = bytearray()
        self._max_line = max_line
        self._max_bulk = max_bulk
        self._max_items = max_items
        self._max_depth = max_depth
        self._max_buffer = max_buffer
        self._failed = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._failed:
            raise RespProtocolError("the parser has failed")
        self._buf += data
        if len(self._buf) > self._max_buffer:
            self._fail("unparsed replies over the buffer cap")

    def feed_eof(self) -> None:
        """The peer closed: a partial reply left over is a protocol error."""
        if self._buf:
            self._fail("connection closed inside a reply")

    def next_reply(self) -> tuple[bool, Reply]:
        """``(True, reply)`` for the next whole reply, ``(False, None)`` until one is."""
        if self._failed:
            raise RespProtocolError("the parser has failed")
        if not self._buf:
            return False, None
        try:
            reply, end = self._parse(0, 0)
        except _Incomplete:
            if self._buf.find(b"\r\n") < 0 and len(self._buf) > self._max_line:
                self._fail("a line over the cap")
            return False, None
        del self._buf[:end]
        return True, reply

    def _fail(self, why: str) -> None:
        self._failed = True
        self._buf.clear()
        raise RespProtocolError(why)

    def _line(self, pos: int) -> tuple[bytes, int]:
        end = self._buf.find(b"\r\n", pos)
        if end < 0:
            raise _Incomplete
        if end - pos > self._max_line:
            self._fail("a line over the cap")
        return bytes(self._buf[pos:end]), end + 2

    def _int(self, raw: bytes) -> int:
        if not raw or not (raw.isdigit() or (raw[:1] == b"-" and raw[1:].isdigit())):
            self._fail("not an integer")
        return int(raw)

    def _parse(self, pos: int, depth: int) -> tuple[Reply, int]:
        if pos >= len(self._buf):
            raise _Incomplete
        kind = self._buf[pos : pos + 1]
        line, after = self._line(pos + 1)
        if kind == b"+":
            return line.decode("utf-8", "replace"), after
        if kind == b"-":
            return RespError(line.decode("utf-8", "replace")), after
        if kind == b":":
            return self._int(line), after
        if kind == b"$":
            size = self._int(line)
            if size == -1:
                return None, after
            if size < 0 or size > self._max_bulk:
                self._fail("a bulk string over the cap")
            end = after + size
            if len(self._buf) < end + 2:
                raise _Incomplete
            if self._buf[end : end + 2] != b"\r\n":
                self._fail("a bulk string without its CRLF")
            return bytes(self._buf[after:end]), end + 2
        if kind == b"*":
            count = self._int(line)
            if count == -1:
                return None, after
            if count < 0 or count > self._max_items:
                self._fail("an array over the cap")
            if depth >= self._max_depth:
                self._fail("arrays nested too deep")
            items: list[Reply] = []
            for _ in range(count):
                item, after = self._parse(after, depth + 1)
                items.append(item)
            return items, after
        self._fail("not a RESP2 type byte")
        raise AssertionError("unreachable")  # _fail raises
