"""A random-per-connection TCP balancer: the Kubernetes Service without
session affinity, in front of several ``serve`` replicas (test equipment).

Each accepted connection goes to a replica picked at random and is piped
both ways until either side closes. Clients that want each request to land
anywhere use a fresh connection per request (:func:`client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator

import httpx


class Balancer:
    def __init__(self, ports: list[int], seed: int = 21) -> None:
        self._ports = ports
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        #: connections sent to each port
        self.picked: Counter[int] = Counter()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self._random.choice(self._ports)
        self.picked[port] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()  # a dead replica: the caller sees a reset, as behind a Service
            return
        both = [
            asyncio.ensure_future(_pipe(reader, up_writer)),
            asyncio.ensure_future(_pipe(up_reader, writer)),
        ]
        for task in both:
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        for task in both:
            task.cancel()
        for stream in (writer, up_writer):
            stream.close()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.CancelledError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


@contextlib.asynccontextmanager
async def balanced(ports: list[int]) -> AsyncIterator[Balancer]:
    balancer = Balancer(ports)
    await balancer.start()
    try:
        yield balancer
    finally:
        await balancer.aclose()


def client(balancer: Balancer, token: str) -> httpx.AsyncClient:
    """A client whose every request opens a new connection (lands anywhere)."""
    return httpx.AsyncClient(
        base_url=balancer.url,
        headers={"authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(30, connect=5),
        limits=httpx.Limits(max_keepalive_connections=0),
    )
