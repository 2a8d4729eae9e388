"""The real ``mistralrs-gateway serve`` as a subprocess, for process-level tests.

``serve`` starts ``python -m gateway.tools.cli serve --port 0``, reads the port from
the one stdout line, and kills the process (by its PID) in a ``finally`` if it
is still running. ``serving`` does the same for several configs at once
(replicas): all are started before any is waited for.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth.authenticator import mint_dev_token
from gateway.config.loader import load_config
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE
from gateway.testing.simulator import Simulator
from tests.support.jwt import HS_SECRET
from tests.support.stack import DEV_ISSUER, metrics_headers

REPO = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"^mistralrs-gateway listening on (https?)://127\.0\.0\.1:(\d+)$")
START_TIMEOUT_S = 15.0


@dataclass
class Served:
    """One running ``serve`` subprocess."""

    proc: subprocess.Popen[bytes]
    url: str
    config: Path
    stdout: Path
    stderr: Path

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.proc.pid, signum)

    def terminate(self, timeout_s: float = 15) -> int:
        """SIGTERM (a drain) and wait for the exit; the exit code."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def stderr_text(self) -> str:
        return self.stderr.read_text(errors="replace")

    def dev_token(self, tenant: str = "acme") -> str:
        return mint_dev_token(
            load_config(self.config).auth,
            tenant,
            scopes=["inference", "evidence"],
            ttl_s=600,
            issuer=DEV_ISSUER,
            env={DEMO_SECRET_ENV: HS_SECRET},
        )

    def receipts_path(self) -> Path:
        return load_config(self.config).audit.path


@contextmanager
def sim_running(**options: Any) -> Iterator[Simulator]:
    sim = Simulator(model_id=SIM_ROUTE, **options)
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


def _spawn(
    config: Path, tmp: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    stdout, stderr = tmp / "serve.stdout", tmp / "serve.stderr"
    env = {**os.environ, DEMO_SECRET_ENV: HS_SECRET, **(env or {})}
    env.pop("GATEWAY_LOG_LEVEL", None)
    argv = [
        sys.executable,
        "-m",
        "gateway.tools.cli",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
    ]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)
    return proc, stdout, stderr


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()  # by its PID
    for proc in procs:
        proc.wait(10)


@contextmanager
def serve(config: Path, tmp: Path, env: dict[str, str] | None = None) -> Iterator[Served]:
    """Start ``serve`` on an OS-chosen port; return once it printed its address.
    ``env`` adds to the test's environment."""
    proc, stdout, stderr = _spawn(config, tmp, env)
    try:
        url = _wait_listening(proc, stdout, stderr)
        yield Served(proc, url, config, stdout, stderr)
    finally:
        _reap([proc])


@contextmanager
def serving(configs: list[Path]) -> Iterator[list[Served]]:
    """One ``serve`` per config (output next to each config), started together."""
    spawned: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    try:
        for config in configs:
            spawned.append(_spawn(config, config.parent))
        yield [
            Served(proc, _wait_listening(proc, out, err), config, out, err)
            for config, (proc, out, err) in zip(configs, spawned, strict=True)
        ]
    finally:
        _reap([proc for proc, _, _ in spawned])


def _wait_listening(proc: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = stdout.read_text().splitlines()
        if lines:
            assert len(lines) == 1, lines
            match = _LISTENING.fullmatch(lines[0])
            assert match is not None, lines[0]
            return f"{match.group(1)}://127.0.0.1:{match.group(2)}"
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}: {stderr.read_text()[-2000:]}")
        time.sleep(0.02)
    raise AssertionError("serve printed no listening line in time")


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def wait_ready(client: httpx.Client, timeout_s: float = 5) -> None:
    wait_until(lambda: client.get("/readyz").status_code == 200, timeout_s, "/readyz 200")


def metric(client: httpx.Client, name: str, /, scrape_as: str = "acme", **labels: str) -> float:
    """The sample's value (0 if absent), scraped with a ``metrics`` credential of
    tenant ``scrape_as`` (one the gateway knows)."""
    text = client.get("/metrics", headers=metrics_headers(scrape_as)).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and dict(sample.labels) == labels:
                return float(sample.value)
    return 0.0
