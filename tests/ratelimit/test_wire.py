"""The lean Redis client against real redis-server instances (loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trustme

from gateway.errors import GatewayError
from gateway.ratelimit import RedisLimitsStore, TenantLimits
from gateway.ratelimit.resp import RespError
from gateway.ratelimit.wire import RedisWire
from tests.support.redis import REDIS_SERVER, RedisServer, free_port, redis_server


@contextlib.asynccontextmanager
async def wire(url: str, **kwargs: object) -> AsyncIterator[RedisWire]:
    made = RedisWire.from_url(url, **kwargs)  # type: ignore[arg-type]
    try:
        yield made
    finally:
        await made.aclose()


async def test_a_pipeline_answers_in_order_with_error_replies_as_values(redis_url: str) -> None:
    async with wire(redis_url) as client:
        replies = await client.execute(
            [("SET", "k", "v"), ("GET", "k"), ("INCR", "k"), ("GET", "missing"), ("PING",)]
        )
    assert replies[:2] == ["OK", b"v"]
    assert isinstance(replies[2], RespError) and replies[2].code == "ERR"
    assert replies[3:] == [None, "PONG"]


async def test_connections_are_reused_and_bounded(own_redis: RedisServer) -> None:
    async with wire(own_redis.url, max_connections=2) as client:
        for _ in range(5):
            assert await client.execute([("PING",)]) == ["PONG"]
        assert client.idle_connections == 1  # one connection did all five
        with own_redis.client() as admin:
            admin.execute_command("CLIENT", "PAUSE", 300, "WRITE")
            # three at once, two connections: the third waits for a free one
            batch = asyncio.gather(*(client.execute([("SET", "a", i)]) for i in range(3)))
            await asyncio.sleep(0.05)  # all three started; the pause holds the writes
            clients = admin.client_list()
            replies = await batch
        assert replies == [["OK"]] * 3
        assert len(clients) == 3  # two of ours and the admin, never a third of ours
        assert client.idle_connections == 2


async def test_a_cancelled_call_closes_its_connection(own_redis: RedisServer) -> None:
    """A reply still in flight must never reach the next caller."""
    async with wire(own_redis.url) as client:
        await client.execute([("SET", "x", "first")])
        with own_redis.client() as admin:
            admin.execute_command("CLIENT", "PAUSE", 300, "ALL")
        task = asyncio.create_task(client.execute([("GET", "x")]))
        await asyncio.sleep(0.05)  # the command is written and its reply held by the pause
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.idle_connections == 0
        assert await client.execute([("ECHO", "second")]) == [b"second"]


async def test_a_connection_the_server_drops_fails_its_caller_and_is_replaced(
    own_redis: RedisServer,
) -> None:
    async with wire(own_redis.url) as client:
        await client.execute([("PING",)])
        with own_redis.client() as admin:
            admin.execute_command("CLIENT", "PAUSE", 500, "ALL")
            task = asyncio.create_task(client.execute([("PING",)]))
            await asyncio.sleep(0.05)
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        with pytest.raises(ConnectionError):
            await task
        assert await client.execute([("PING",)]) == ["PONG"]


async def test_auth_with_a_password_and_with_a_user() -> None:
    with redis_server(password="pw-1") as server:
        async with wire(server.url, password="pw-1") as client:
            assert await client.execute([("PING",)]) == ["PONG"]
        async with wire(server.url, password="wrong") as client:
            with pytest.raises(RespError) as info:
                await client.execute([("PING",)])
            assert info.value.code == "WRONGPASS"
        with server.client() as admin:
            admin.execute_command("ACL", "SETUSER", "limits", "on", ">pw-2", "~*", "+@all")
        user_url = server.url.replace("redis://", "redis://limits@")
        async with wire(user_url, password="pw-2") as client:
            assert await client.execute([("ACL", "WHOAMI")]) == [b"limits"]


async def test_the_database_in_the_url_is_selected(shared_redis: RedisServer) -> None:
    async with wire(shared_redis.url.rsplit("/", 1)[0] + "/3") as client:
        await client.execute([("SET", "in-db-3", "yes")])
    with shared_redis.client() as admin:
        admin.execute_command("SELECT", 3)
        assert admin.get("in-db-3") == b"yes"
        admin.delete("in-db-3")
        admin.execute_command("SELECT", 0)
        assert admin.get("in-db-3") is None


async def test_a_server_that_does_not_speak_resp_is_a_connection_error() -> None:
    async def http_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with wire(f"redis://127.0.0.1:{port}/0") as client:
            with pytest.raises(ConnectionError):
                await client.execute([("PING",)])
    finally:
        server.close()
        await server.wait_closed()


async def test_nothing_listening_is_a_connection_error_naming_the_address() -> None:
    port = free_port()
    async with wire(f"redis://127.0.0.1:{port}/0") as client:
        with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
            await client.execute([("PING",)])


async def test_the_store_reloads_its_scripts_after_a_script_flush(redis_url: str) -> None:
    store = RedisLimitsStore.from_url(redis_url, timeout_s=2)
    await store.start()
    limits = TenantLimits(requests_per_minute=10, max_concurrent_requests=2)
    first = await store.reserve("acme", limits, 0)
    async with wire(redis_url) as admin:
        assert await admin.execute([("SCRIPT", "FLUSH")]) == ["OK"]
    store.settle(first, 0)  # a settlement after the flush: NOSCRIPT, loaded, applied
    assert await store.flush(5)
    second = await store.reserve("acme", limits, 0)
    assert second.headers()["x-ratelimit-remaining-requests"] == "8"
    store.settle(second, 0)
    assert await store.aclose(5) == 0


# --- TLS (rediss://) -----------------------------------------------------------------


@contextlib.contextmanager
def tls_redis(tmp_path: Path, ca: trustme.CA) -> Iterator[int]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    port = free_port()
    argv = [
        REDIS_SERVER,
        *("--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
        *("--tls-cert-file", str(tmp_path / "cert.pem")),
        *("--tls-key-file", str(tmp_path / "key.pem")),
        *("--tls-ca-cert-file", str(tmp_path / "ca.pem"), "--tls-auth-clients", "no"),
        *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        *("--logfile", str(tmp_path / "redis.log")),
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        yield port
    finally:
        proc.terminate()  # by its PID
        proc.wait(10)


async def _until_up(url: str, context: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            async with wire(url, ssl_context=context) as client:
                await client.execute([("PING",)])
            return
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_rediss_verifies_the_server_and_the_store_works_over_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    with tls_redis(tmp_path, ca) as port:
        url = f"rediss://127.0.0.1:{port}/0"
        await _until_up(url, trusting)
        # the default context trusts the system CAs only: this private CA is refused
        async with wire(url) as client:
            with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.execute([("PING",)])
        store = RedisLimitsStore(
            RedisWire.from_url(url, ssl_context=trusting, connect_timeout_s=2), timeout_s=2
        )
        await store.start()
        assert store.healthy
        hold = await store.reserve("acme", TenantLimits(requests_per_minute=5), 0)
        assert hold.headers()["x-ratelimit-remaining-requests"] == "4"
        store.settle(hold, 0)
        assert await store.aclose(5) == 0
        # and a store on the system CAs refuses the server: limits_unavailable
        refused = RedisLimitsStore.from_url(url, timeout_s=2)
        await refused.start()
        assert not refused.healthy
        with pytest.raises(GatewayError):
            await refused.reserve("acme", TenantLimits(requests_per_minute=5), 0)
        await refused.aclose(1)
