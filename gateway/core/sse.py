"""Sans-I/O Server-Sent Events: WHATWG framing, shared by every stream dialect.

Theory of operation
-------------------

:class:`StreamValidator` owns no socket. The caller feeds it the worker's
body bytes exactly as they arrive with :meth:`~StreamValidator.receive_data`
(``b""`` means the body ended), then calls
:meth:`~StreamValidator.next_event` until it returns :data:`NEED_DATA`. Each
call yields at most one event:

* :class:`KeepAlive` -- an event with no ``data:`` line (the worker's
  ``:\\n\\n`` comment). It resets the idle timer and is forwarded as
  ``:\\n\\n``.
* an item of the dialect -- what its :class:`Grammar` made of one event
  (a validated chat chunk, a Responses event, …).
* :class:`Done` -- the grammar saw its terminator (``data: [DONE]``) *and
  then* the body ended with no further byte. Only then may the caller send
  its own terminator: a stream is valid end to end or not at all.

Framing (this module) is apart from grammar (``gateway/apis``), as h11 keeps
its readers apart from its state machine: lines are cut at LF, CRLF or CR (a
CR that ends one feed and an LF that starts the next form one line end), a
leading BOM is dropped, ``data:`` takes one optional space, several ``data:``
lines join with LF, ``event:`` names the event (empty means unnamed),
``id:``, ``retry:``, unknown fields and comments carry nothing forwarded.
Lines are decoded as strict UTF-8 only once complete, so a split inside a
multi-byte character is harmless and results never depend on how the bytes
were split.

Bounds (:class:`Framing`): bytes past ``max_stream_bytes`` are never
buffered; the partial line is checked against the line and event bounds as
it grows; events (keep-alives and the terminator included) are counted as
they are dispatched. A bound is reported at the position where it was
crossed, after every event before it.

Errors: any failure (a bound, a grammar violation, EOF before the
terminator) moves the validator to its error state, from which every later
:meth:`~StreamValidator.next_event` re-raises the same
:class:`~gateway.core.errors.GatewayError` -- the one error sink. EOF before the
terminator, mid-line included, is ``upstream_unavailable`` (outcome
``incomplete``); bytes after the terminator are a protocol violation.
Messages are fixed texts: stream content is model output and never goes into
them (nor into their ``__cause__``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from gateway.core.errors import GatewayError

__all__ = [
    "NEED_DATA",
    "Done",
    "Framing",
    "Grammar",
    "KeepAlive",
    "NeedData",
    "StreamValidator",
    "violation",
]

_EOL: Final = re.compile(rb"[\r\n]")
_CR: Final = 0x0D
_LF: Final = 0x0A

T_co = TypeVar("T_co", covariant=True)


def violation(message: str) -> GatewayError:
    """A broken stream rule: ``upstream_protocol_error`` (spec §12)."""
    return GatewayError("upstream_protocol_error", message, outcome="protocol_error")


@dataclass(frozen=True, slots=True)
class Framing:
    """Size and count bounds of one stream; built per request."""

    max_line_bytes: int = 1_048_576
    max_event_bytes: int = 1_048_576
    max_stream_bytes: int = 67_108_864
    max_events: int = 100_000

    def __post_init__(self) -> None:
        bounds = (self.max_line_bytes, self.max_event_bytes, self.max_stream_bytes, self.max_events)
        if min(bounds) < 1:
            raise ValueError("stream bounds must be positive")


@dataclass(slots=True)
class KeepAlive:
    """An event without data (a comment); forward as ``b":\\n\\n"``."""


@dataclass(slots=True)
class Done:
    """The terminator arrived and the body then ended cleanly."""


class NeedData(enum.Enum):
    """Type of the :data:`NEED_DATA` sentinel (an enum so ``is`` narrows it)."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


class _Slow(enum.Enum):
    SLOW = "SLOW"


#: the fast path declined: frame this event line by line
_SLOW: Final = _Slow.SLOW


class Grammar(Protocol[T_co]):
    """A dialect's state machine over framed events (pure; raises GatewayError)."""

    @property
    def terminated(self) -> bool:
        """True once the dialect's terminator arrived: only EOF may follow."""
        ...

    def on_event(self, name: str | None, data: str) -> T_co | None:
        """One dispatched event with data: an item for the caller, or None
        (consumed, e.g. the terminator)."""
        ...


class StreamValidator(Generic[T_co]):
    """WHATWG SSE framing under a dialect's grammar; see the module docstring."""

    def __init__(self, framing: Framing, grammar: Grammar[T_co]) -> None:
        self.framing = framing
        self._grammar = grammar
        self._error: GatewayError | None = None
        self._closed = False
        self._buf = bytearray()
        self._pos = 0
        self._skip_lf = False
        self._first_line = True
        self._eof = False
        self._overflow = False
        #: a CR may be in the buffer (the one-line path then looks for it)
        self._cr = False
        self._bytes_received = 0
        # the event being assembled
        self._event_open = False
        self._event_bytes = 0
        self._name: str | None = None
        self._data: list[str] = []
        self._events = 0
        #: the text of the line :meth:`_lf_line` found last
        self._line = ""

    # -- read-only view -------------------------------------------------------

    @property
    def grammar(self) -> Grammar[T_co]:
        # A property, not an attribute, so a subclass may narrow its type (a
        # compiled class's attributes keep the type they were declared with).
        return self._grammar

    @property
    def error(self) -> GatewayError | None:
        return self._error

    @property
    def closed(self) -> bool:
        """:class:`Done` was returned."""
        return self._closed

    @property
    def events(self) -> int:
        return self._events

    @property
    def bytes_received(self) -> int:
        return self._bytes_received

    @property
    def pending_bytes(self) -> int:
        """Bytes held for a line or an event not yet complete.

        Once :meth:`next_event` has returned :data:`NEED_DATA` this is at most
        ``max_line_bytes + max_event_bytes``, whatever the worker sent.
        """
        return len(self._buf) - self._pos + self._event_bytes

    # -- input ----------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer ``data``; ``b""`` marks the end of the body."""
        if self._error is not None:
            return
        if self._eof:
            if data:
                raise RuntimeError("receive_data() called after EOF")
            return
        if not data:
            self._eof = True
            return
        before = self._bytes_received
        self._bytes_received += len(data)
        limit = self.framing.max_stream_bytes
        if self._bytes_received > limit:
            # keep what fits so the events before the bound still come out
            self._overflow = True
            data = data[: max(0, limit - before)]
        self._buf += data
        if not self._cr and b"\r" in data:
            self._cr = True

    # -- output ---------------------------------------------------------------

    def next_event(self) -> KeepAlive | T_co | Done | NeedData:
        """The next event, :data:`NEED_DATA`, or a :class:`GatewayError`."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            return self._next_event()
        except GatewayError as exc:
            self._error = exc
            self._buf.clear()
            self._data.clear()
            raise

    def _next_event(self) -> KeepAlive | T_co | Done | NeedData:
        grammar = self._grammar
        while True:
            if grammar.terminated:
                return self._after_terminator()
            if not (self._event_open or self._skip_lf or self._first_line):
                # Nearly every event a worker sends is one ``data: …`` line and
                # a blank line: framed with one search, not two line reads.
                fast = self._one_line_event()
                if fast is not _SLOW:
                    if fast is not None:
                        return fast
                    continue  # consumed (the terminator): look again
            line = self._next_line()
            if line is None:
                return self._starved()
            if line:
                self._on_field(line)
                continue
            if not self._event_open:
                continue
            event = self._dispatch()
            if event is not None:
                return event

    def _starved(self) -> NeedData:
        """No complete line is buffered: check what is pending, then wait."""
        self._check_line_length(len(self._buf) - self._pos)
        if self._overflow:
            raise violation("Upstream stream exceeded the total size limit.")
        if self._eof:
            raise GatewayError(
                "upstream_unavailable",
                "The inference worker closed the stream before it was complete.",
                outcome="incomplete",
            )
        del self._buf[: self._pos]
        self._cr = b"\r" in self._buf
        self._pos = 0
        return NEED_DATA

    def _after_terminator(self) -> Done | NeedData:
        if self._closed:
            return Done()
        self._consume_lf()
        if self._pos < len(self._buf):
            raise violation("Upstream sent data after its stream's terminator.")
        if self._overflow:
            raise violation("Upstream stream exceeded the total size limit.")
        if not self._eof:
            self._buf.clear()
            self._pos = 0
            return NEED_DATA
        self._closed = True
        return Done()

    # -- framing (WHATWG) -------------------------------------------------------

    def _consume_lf(self) -> None:
        """Drop the LF of a CRLF whose CR ended the previous line."""
        if self._skip_lf and self._pos < len(self._buf):
            self._skip_lf = False
            if self._buf[self._pos] == _LF:
                self._pos += 1

    def _check_line_length(self, n: int) -> None:
        # Whichever bound a growing line crosses first is reported, so a line
        # seen whole and one seen byte by byte fail alike.
        max_line = self.framing.max_line_bytes
        room = self.framing.max_event_bytes - self._event_bytes
        if n > min(max_line, room):
            if max_line <= room:
                raise violation("Upstream SSE line exceeded the size limit.")
            raise violation("Upstream SSE event exceeded the size limit.")

    def _next_line(self) -> str | None:
        self._consume_lf()
        buf, start = self._buf, self._pos
        match = _EOL.search(buf, start)
        if match is None:
            return None
        end = match.start()
        self._check_line_length(end - start)
        self._pos = end + 1
        if buf[end] == _CR:
            self._skip_lf = True
        try:
            line: str | None = buf[start:end].decode("utf-8")
        except UnicodeDecodeError:
            line = None
        if line is None:
            # Raised outside the handler: the decode error carries the raw bytes
            # (model output) and must not ride along as the context (``from
            # None`` would do in Python, but not in the compiled build).
            raise violation("Upstream stream is not valid UTF-8.")
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        self._event_bytes += end - start
        return line

    def _one_line_event(self) -> T_co | _Slow | None:
        """The grammar's item for the event at the buffer's start when it is
        exactly ``data: X`` LF LF, or ``event: N`` LF ``data: X`` LF LF (the
        Responses and Messages form), with no CR in it; else :data:`_SLOW` and
        nothing consumed: the general path then frames it, with the same result
        and the same errors."""
        start = self._pos
        framing = self.framing
        end = self._lf_line(start)
        if end < 0:
            return _SLOW
        line = self._line
        name: str | None = None
        # the event's bytes: its lines without their LFs
        event_bytes = end - start
        if line.startswith("event: "):
            name = line[7:] or None
            end = self._lf_line(end + 1)
            if end < 0:
                return _SLOW
            line = self._line
            event_bytes = end - start - 1
        if not line.startswith("data: "):
            return _SLOW
        buf = self._buf
        if end + 1 >= len(buf) or buf[end + 1] != _LF:
            return _SLOW
        if event_bytes > framing.max_event_bytes:
            return _SLOW
        if self._events >= framing.max_events:
            return _SLOW
        self._pos = end + 2
        self._events += 1
        return self._grammar.on_event(name, line[6:])

    def _lf_line(self, at: int) -> int:
        """Where the line at ``at`` ends when it ends with a bare LF, is within
        the line bound, is UTF-8 and holds no CR (its text then in ``_line``);
        else -1. One ``find`` (memchr) and a decode; the text is searched for a
        CR only while one may be buffered (``_cr``, set as bytes arrive)."""
        buf = self._buf
        end = buf.find(b"\n", at)
        if end < 0 or end - at > self.framing.max_line_bytes:
            return -1
        try:
            line = buf[at:end].decode("utf-8")
        except UnicodeDecodeError:
            return -1
        if self._cr and "\r" in line:
            return -1
        self._line = line
        return end

    def _on_field(self, line: str) -> None:
        self._event_open = True
        if line[0] == ":":
            return
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._name = value or None
        # id:, retry: and unknown fields carry nothing the gateway forwards

    def _dispatch(self) -> KeepAlive | T_co | None:
        self._event_open = False
        self._event_bytes = 0
        self._events += 1
        if self._events > self.framing.max_events:
            raise violation("Upstream stream exceeded the event count limit.")
        name, self._name = self._name, None
        if not self._data:
            if name is not None:
                # A named event without data is still a named event, not a keep-alive.
                return self._grammar.on_event(name, "")
            return KeepAlive()
        data = "\n".join(self._data) if len(self._data) > 1 else self._data[0]
        self._data.clear()
        return self._grammar.on_event(name, data)
