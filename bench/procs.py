"""Child processes of the benchmark (simulator, gateway) and their /proc figures.

Each child writes stdout/stderr to files (a full pipe would stall it); the
listening port is read from its first stdout line. Children are stopped by
their own PID only: SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gateway.testing.harness import SIM_ROUTE
from tests.support.poll import eventually

_LISTENING = re.compile(rb"listening on https?://127\.0\.0\.1:(\d+)")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Child:
    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        env: dict[str, str],
        cpus: set[int] | None = None,
    ) -> None:
        self.name = name
        self.stdout_path = workdir / f"{name}.out"
        self.stderr_path = workdir / f"{name}.err"

        def pin() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, env=env, cwd=workdir, preexec_fn=pin
            )
        self.pid = self.proc.pid
        self.port = 0

    def wait_listening(self, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.stdout_path.read_bytes())
            if match:
                self.port = int(match.group(1))
                return self.port
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        tail = self.stderr_path.read_bytes()[-2000:].decode(errors="replace")
        raise RuntimeError(f"{self.name} did not start listening:\n{tail}")

    def cpu_s(self) -> float:
        """utime + stime of the process, in seconds (/proc/<pid>/stat)."""
        raw = Path(f"/proc/{self.pid}/stat").read_bytes()
        fields = raw[raw.rindex(b")") + 2 :].split()
        # Fields after the comm: state is [0]; utime and stime are stat fields 14, 15.
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def thread_cpu_s(self) -> float:
        """utime + stime of the process's threads other than its main one."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            if task.name == str(self.pid):
                continue
            try:
                raw = (task / "stat").read_bytes()
            except OSError:
                continue  # a thread that ended meanwhile
            fields = raw[raw.rindex(b")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
        return total / _CLK_TCK

    def status_kb(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def reset_peak_rss(self) -> bool:
        """Reset VmHWM to the current RSS (Linux clear_refs "5"); False when refused."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def stop(self, timeout_s: float = 8, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_simulator(workdir: Path, env: dict[str, str], cpus: set[int] | None = None) -> Child:
    """The protocol simulator serving ``SIM_ROUTE`` on a free port, listening on return."""
    argv = [sys.executable, "-m", "gateway.testing.simulator", "--port", "0"]
    sim = Child("simulator", [*argv, "--model-id", SIM_ROUTE], workdir, env, cpus=cpus)
    sim.wait_listening()
    return sim


def gateway_command() -> list[str]:
    """The installed ``mistralrs-gateway`` script, else ``python -m gateway.tools.cli``."""
    script = Path(sys.executable).parent / "mistralrs-gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.tools.cli"]


def wait_ready(port: int, timeout_s: float = 20) -> None:
    """Poll the gateway's ``/readyz`` until it answers 200."""

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    if not eventually(ready, timeout_s):
        raise RuntimeError("gateway did not become ready")


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(the gateway's CPU, everything else's); None, None with fewer than two CPUs."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None, None
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])
