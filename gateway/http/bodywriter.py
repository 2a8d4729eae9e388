"""A streamed response's body frames written straight to the caller's connection.

Each read of a streamed answer went to the caller through three coroutines
(the relay's send, the app's one wrapper, uvicorn's ``send``) and a message
dict, only for uvicorn to frame it as one HTTP chunk. The listener's
protocol offers, per request, ``scope["extensions"]["gateway.body"]``: a
:class:`BodyWriter` bound to that request's cycle, which does what uvicorn's
``send`` does for a body message with ``more_body`` once the head is out --
the same chunk framing, the same transport (the corked one), the same
checks -- without the layers in between.

It applies only between the head and the last body message: the head, the
terminator and any error frame still go through ``send`` (the head's
headers, the access status, keep-alive and the response's completion stay
uvicorn's and the app's). :meth:`BodyWriter.ready` says whether it applies
(the head went out chunked, the response is not complete); a caller
without the extension (a test's ASGI transport) uses ``send`` throughout.

Flow control and disconnects are uvicorn's, read from the same state:
:attr:`BodyWriter.paused` is true while the caller's transport buffer is
over its high-water mark (and the caller still connected), and the relay
then awaits :meth:`BodyWriter.drain` before writing, as ``send`` would; a
frame for a caller gone (``cycle.disconnected``) is dropped, as ``send``
drops it. So a caller that stops reading still stalls the relay on the
drain, and the relay's deadline still cuts it.
"""

from __future__ import annotations

from typing import Any

#: scope["extensions"] key of the request's :class:`BodyWriter`
BODY_EXTENSION = "gateway.body"


class BodyWriter:
    __slots__ = ("_cycle", "_flow", "_transport")

    def __init__(self, cycle: Any) -> None:
        # uvicorn's RequestResponseCycle: its transport (the corked one) and flow control.
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport

    def ready(self) -> bool:
        """True when body frames may be written here: the head went out with
        chunked framing and the response has not completed."""
        cycle = self._cycle
        return bool(
            cycle.response_started
            and cycle.chunked_encoding
            and not cycle.response_complete
            and cycle.scope["method"] != "HEAD"
        )

    @property
    def paused(self) -> bool:
        """The caller's buffer is full and the caller still there: drain first."""
        return bool(self._flow.write_paused and not self._cycle.disconnected)

    async def drain(self) -> None:
        await self._flow.drain()

    def write(self, body: bytes) -> None:
        """One chunk of the response body (nothing for an empty one, or for a
        caller gone), as uvicorn's ``send`` frames it."""
        if body and not self._cycle.disconnected:
            self._transport.write(b"%x\r\n%b\r\n" % (len(body), body))
