"""A real ``redis-server`` for tests: loopback only, no persistence, stopped by PID.

:class:`RedisServer` starts ``redis-server`` on a free 127.0.0.1 port in a
temporary directory (``--save "" --appendonly no``: nothing is written but
its log), polls ``PING`` with a deadline instead of sleeping, and can be
stopped and started again on the same port (outage tests). ``close()``
stops it and removes the directory, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from redis import Redis
from redis.exceptions import RedisError

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
_START_DEADLINE_S = 10.0
_STOP_DEADLINE_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    def __init__(self, *, password: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gw-redis-"))
        self.port = free_port()
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self) -> Redis:
        """A synchronous client for inspecting the server from a test."""
        return Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def start(self) -> None:
        if self.running:
            return
        argv = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_DEADLINE_S
        probe = Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
        )
        try:
            while time.monotonic() < deadline:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    break
                with contextlib.suppress(OSError, RedisError):
                    if probe.ping():
                        return
                time.sleep(0.01)
        finally:
            probe.close()
        log = self.dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port}:\n{tail}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # by PID: this process only
        try:
            proc.wait(_STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_STOP_DEADLINE_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def redis_server(*, password: str | None = None) -> Iterator[RedisServer]:
    """A started server; a port taken between probing and binding gets a new one (3 tries)."""
    server = RedisServer(password=password)
    try:
        start_on_a_free_port(server)
        yield server
    finally:
        server.close()


class _Startable(Protocol):
    port: int

    def start(self) -> None: ...


def start_on_a_free_port(server: _Startable, tries: int = 3) -> None:
    """``server.start()``; a port another process took between probing and
    binding (RuntimeError) gets a new one, ``tries`` times in all."""
    for attempt in range(tries):
        try:
            server.start()
            return
        except RuntimeError:
            if attempt == tries - 1:
                raise
            server.port = free_port()
