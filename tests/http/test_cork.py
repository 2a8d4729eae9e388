"""CorkedTransport: one write per loop turn, bytes and order unchanged."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.http.cork import HOLD_BYTES, CorkedTransport


class _Recorder:
    """The real transport's side: what reached it, write by write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


def _corked() -> tuple[CorkedTransport, _Recorder]:
    real = _Recorder()
    return CorkedTransport(cast(asyncio.Transport, real), asyncio.get_running_loop()), real


async def _next_turn() -> None:
    await asyncio.sleep(0)


async def test_writes_of_one_turn_go_out_as_one_write_in_order() -> None:
    corked, real = _corked()
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.write(b"")
    corked.write(b"5\r\nhello\r\n")
    corked.write(b"0\r\n\r\n")
    assert real.writes == []
    await _next_turn()
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n0\r\n\r\n"]
    corked.write(b"next")
    await _next_turn()
    assert real.writes[1:] == [b"next"]


async def test_past_hold_bytes_what_is_held_goes_out_at_once() -> None:
    corked, real = _corked()
    corked.write(b"head")
    big = b"x" * (HOLD_BYTES + 1)
    corked.write(big)
    assert real.writes == [b"head" + big]  # before the turn ends: backpressure applies
    await _next_turn()
    assert real.writes == [b"head" + big]


async def test_close_writes_what_is_held_and_abort_drops_it() -> None:
    corked, real = _corked()
    corked.write(b"last words")
    corked.close()
    assert real.writes == [b"last words"] and real.closed
    await _next_turn()
    assert real.writes == [b"last words"]
    corked, real = _corked()
    corked.write(b"never sent")
    corked.abort()
    await _next_turn()
    assert real.writes == [] and real.aborted


async def test_a_transport_closed_meanwhile_gets_nothing_and_the_rest_passes_through() -> None:
    corked, real = _corked()
    corked.write(b"late")
    real.closed = True
    await _next_turn()
    assert real.writes == []
    assert corked.is_closing()
    assert corked.get_extra_info("peername") == "info:peername"
