"""A caller connection's writes joined per event-loop turn.

uvicorn writes a response head as soon as the app sends ``http.response.start``
and each body message as it comes: a streamed answer whose worker bytes
arrived in one read went out as three sends (head, events, terminator and
the last chunk), each a syscall and a loopback segment. :class:`CorkedTransport`
holds what is written during one turn of the loop and writes it at the start
of the next, as one buffer: the bytes and their order are unchanged, they
only leave a few microseconds later, together.

Flow control is the real transport's: at most :data:`HOLD_BYTES` are held,
and a write that would pass it goes out at once with what is held, so a
big reply (an embeddings answer spliced in 1 MiB pieces) meets the
transport's backpressure piece by piece, as before. ``close`` writes what
is held first; ``abort`` drops it, as the transport's own buffer is dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: what one loop turn may hold back: a streamed answer's head and events
HOLD_BYTES = 65_536


class CorkedTransport:
    __slots__ = ("_held", "_held_bytes", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._held_bytes = 0

    def write(self, data: bytes) -> None:
        if not data:
            return
        if self._held is None:
            self._held = [data]
            self._held_bytes = len(data)
            self._loop.call_soon(self._flush)
        else:
            self._held.append(data)
            self._held_bytes += len(data)
        if self._held_bytes > HOLD_BYTES:
            self._flush()

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        held, self._held = self._held, None
        self._held_bytes = 0
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        # get_extra_info, pause_reading, resume_reading, set_protocol …
        return getattr(self._transport, name)
