"""A worker's one-body answer as a sans-I/O source, bounded as it arrives. Pure.

:class:`JsonBody` parses the body once it ended (a JSON answer: embeddings,
token counts); :class:`HeldBody` holds the bytes in one growing buffer and
hands them to its subclass whole, without a copy (answers that are checked
in place: embeddings' vectors, an image's base64). Both refuse a body past
their bound as it arrives and keep nothing more of it; then the item, then
:class:`~gateway.core.sse.Done`; one error sink.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from gateway.core.errors import GatewayError
from gateway.core.sse import NEED_DATA, Done, NeedData, violation


class JsonBody:
    """A worker's one JSON answer as a sans-I/O source: bytes in (bounded), the
    parsed object out once the body ended, then :class:`~gateway.core.sse.Done`."""

    def __init__(
        self,
        max_bytes: int,
        loads: Callable[[bytes | str], Any] = json.loads,
        *,
        what: str = "answer",
    ) -> None:
        self._max = max_bytes
        self._loads = loads
        self._what = what
        self._buf = bytearray()
        self._eof = False
        self._parsed = False
        self._error: GatewayError | None = None
        self.bytes_received = 0

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
            return
        self.bytes_received += len(data)
        if self.bytes_received <= self._max:
            self._buf += data

    def next_event(self) -> Any | Done | NeedData:
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._parsed:
            return Done()
        if self.bytes_received > self._max:
            self._error = violation(f"Upstream {self._what} exceeded the size limit.")
            raise self._error
        if not self._eof:
            return NEED_DATA
        try:
            result = self._result()
        except GatewayError as exc:
            self._error = exc
            # Not the parse's frames: they would hold the buffer as long as the error lives.
            raise exc.with_traceback(None) from None
        finally:
            self._release()
        self._parsed = True
        return result

    def _result(self) -> Any:
        """The whole body, once it ended, as the caller's item."""
        try:
            return self._loads(bytes(self._buf))
        except (ValueError, RecursionError):
            raise violation("Upstream answer is not valid JSON.") from None

    def _release(self) -> None:
        self._buf.clear()


class HeldBody(JsonBody):
    """The body held in one ``BytesIO`` (it grows in place and hands its bytes
    over without a copy); subclasses read :attr:`_held` in ``_result``."""

    def __init__(self, max_bytes: int, *, what: str = "answer") -> None:
        super().__init__(max_bytes, what=what)
        self._held: io.BytesIO | None = io.BytesIO()

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
            return
        self.bytes_received += len(data)
        if self._held is None:
            return
        if self.bytes_received > self._max:
            self._held = None  # refused: nothing more is kept
            return
        self._held.write(data)

    def _result(self) -> Any:
        """The held bytes, handed over without a copy (``BytesIO`` gives its
        buffer away once nothing else views it)."""
        held = self._held
        assert held is not None
        return held.getvalue()

    def _release(self) -> None:
        self._held = None
