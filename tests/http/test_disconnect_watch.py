"""The listener's ``gateway.disconnect`` watch: what a task looping on
``receive`` until ``http.disconnect`` would do, without the task.

A real :class:`LimitedHttpProtocol` over a recording transport serves one
request to an app that hands its scope and ``send`` out and waits."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http.asgi import ABORT_EXTENSION, DISCONNECT_EXTENSION
from gateway.http.protocol import LimitedHttpProtocol

REQUEST = b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}"


class _Transport:
    def __init__(self) -> None:
        self.closing = False
        self.reading = True

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str) -> Any:
        return None


class _Served:
    def __init__(self) -> None:
        self.scope: dict[str, Any] = {}
        self.send: Any = None
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.scope, self.send = scope, send
        await receive()  # the body
        self.started.set()
        await self.release.wait()


async def _serve() -> tuple[LimitedHttpProtocol, _Transport, _Served]:
    app = _Served()
    config = Config(app=cast(Any, app), lifespan="off", log_level="warning")
    protocol = LimitedHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(cast(asyncio.Transport, transport))
    protocol.data_received(REQUEST)
    async with asyncio.timeout(2):
        await app.started.wait()
    return protocol, transport, app


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_caller_gone_calls_back_on_a_later_turn() -> None:
    protocol, _, app = await _serve()
    gone: list[bool] = []
    app.scope["extensions"][DISCONNECT_EXTENSION](lambda: gone.append(True))
    protocol.connection_lost(None)
    assert gone == []  # not from inside connection_lost
    await _turns()
    assert gone == [True]
    app.release.set()


async def test_stopped_before_the_next_turn_it_never_calls_back() -> None:
    _, _, app = await _serve()
    gone: list[bool] = []
    stop = app.scope["extensions"][DISCONNECT_EXTENSION](lambda: gone.append(True))
    # An abort from the request itself, then the request ends at once.
    app.scope["extensions"][ABORT_EXTENSION]()
    stop()
    await _turns()
    assert gone == []
    app.release.set()


async def test_a_complete_response_counts_as_gone_as_receive_says() -> None:
    _, _, app = await _serve()
    gone: list[bool] = []
    app.scope["extensions"][DISCONNECT_EXTENSION](lambda: gone.append(True))
    await _turns()
    assert gone == []  # the caller is there and the response open: nothing
    await app.send({"type": "http.response.start", "status": 200, "headers": []})
    await app.send({"type": "http.response.body", "body": b"ok"})
    await _turns()
    assert gone == [True]
    app.release.set()


async def test_watching_resumes_reading_as_receive_does() -> None:
    protocol, transport, app = await _serve()
    protocol.flow.pause_reading()
    assert not transport.reading
    app.scope["extensions"][DISCONNECT_EXTENSION](lambda: None)
    assert transport.reading
    app.release.set()


async def test_already_gone_calls_back_on_the_next_turn() -> None:
    protocol, _, app = await _serve()
    protocol.connection_lost(None)
    gone: list[bool] = []
    app.scope["extensions"][DISCONNECT_EXTENSION](lambda: gone.append(True))
    assert gone == []
    await _turns()
    assert gone == [True]
    app.release.set()


async def test_each_requests_watch_is_its_own() -> None:
    """The first request answered and still finishing when the next one on the
    connection starts: the next one's watch does not drop the first's."""
    scopes: list[Any] = []
    sends: list[Any] = []
    release, arrived = asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        scopes.append(scope)
        sends.append(send)
        arrived.set()
        await release.wait()

    config = Config(app=app, lifespan="off", log_level="warning")
    protocol = LimitedHttpProtocol(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(cast(asyncio.Transport, _Transport()))
    protocol.data_received(REQUEST)
    async with asyncio.timeout(2):
        await arrived.wait()
    arrived.clear()
    first: list[str] = []
    scopes[0]["extensions"][DISCONNECT_EXTENSION](lambda: first.append("first"))
    await sends[0]({"type": "http.response.start", "status": 200, "headers": []})
    await sends[0]({"type": "http.response.body", "body": b"ok"})
    # The next request starts before the first's callback ran.
    protocol.data_received(REQUEST)
    async with asyncio.timeout(2):
        await arrived.wait()
    second: list[str] = []
    scopes[1]["extensions"][DISCONNECT_EXTENSION](lambda: second.append("second"))
    await _turns()
    assert first == ["first"]  # its response completed: receive would say so
    assert second == []  # the second is open and its caller there
    release.set()
