"""The engine adapter as a child process: start it, find it, read its counters, stop it.

``start_adapter()`` runs ``python -m gateway.testing.engine serve`` (its own
process, so its CPU can be read from ``/proc``), waits with a deadline for its
``listening on`` line, and returns where it is; ``stop()`` ends it by its PID.
Used by the tests (``tests/support/engine.py``), ``mistralrs-gateway demo
--engine`` and ``bench/bench_engine.py``. The model's text is random-weight output.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.testing.engine.cli import READY_PREFIX

__all__ = ["EngineAdapter", "cpu_rate", "cpu_seconds", "running_adapter", "start_adapter"]

_START_TIMEOUT_S = 120.0  # generating the small model on a cold cache included
_STOP_TIMEOUT_S = 10.0


@dataclass
class EngineAdapter:
    """A running adapter: where it listens, the route it serves (the model folder), its pid."""

    base_url: str
    route: str
    pid: int
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)  # its stdout lines (the engine's log)
    pump: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def stats(self) -> dict[str, Any]:
        """The adapter's counters (``GET /adapter/stats``)."""
        answer = httpx.get(self.base_url + "/adapter/stats", timeout=10)
        answer.raise_for_status()
        stats: dict[str, Any] = answer.json()
        return stats

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it has not exited in time."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout=_STOP_TIMEOUT_S)
        if self.pump is not None:
            self.pump.join(timeout=_STOP_TIMEOUT_S)  # EOF on the pipe once the process is gone
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_adapter(
    size: str = "tiny",
    *,
    kind: str = "chat",
    keepalive_ms: float = 10_000,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> EngineAdapter:
    """Start the adapter on a free loopback port; return once it is listening."""
    argv = [
        sys.executable, "-m", "gateway.testing.engine", "serve",
        "--kind", kind, "--model-size", size, "--port", "0",
        "--keepalive-ms", str(keepalive_ms), *(extra_args or []),
    ]  # fmt: skip
    env = {**os.environ, **(extra_env or {})}
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:  # keeps the pipe drained for the process's whole life
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith(READY_PREFIX):
            address, model = line.strip()[len("listening on ") :].split(" model=", 1)
            return EngineAdapter(address, model, process.pid, process, output, pumping)
    failed = EngineAdapter("", "", process.pid, process, output, pumping)
    with contextlib.suppress(ProcessLookupError):
        failed.stop()
    raise RuntimeError("the engine adapter did not start:\n" + "".join(output))


@contextlib.contextmanager
def running_adapter(
    size: str = "tiny",
    *,
    kind: str = "chat",
    keepalive_ms: float = 10_000,
    extra_args: list[str] | None = None,
) -> Iterator[EngineAdapter]:
    adapter = start_adapter(size, kind=kind, keepalive_ms=keepalive_ms, extra_args=extra_args)
    try:
        yield adapter
    finally:
        adapter.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, window_s: float = 0.3) -> float:
    """Cores the process kept busy over the next ``window_s`` seconds."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(window_s)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)
