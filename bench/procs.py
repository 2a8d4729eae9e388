"""Child processes of the benchmark (simulator, gateway) and their /proc figures.

Each child writes stdout/stderr to files (a full pipe would stall it); the
listening port is read from its first stdout line. Children are stopped by
their own PID only: SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
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


# ------------------------------------------------------------------ nginx

NGINX_CONF = """\
worker_processes 1;
error_log {workdir}/nginx-error.log;
pid {workdir}/nginx.pid;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    # nginx's default (1000) would close a caller's kept-alive connection
    # in the middle of a 1000-request C=1 run; the gateway has no such cap.
    keepalive_requests 1000000;
    client_body_temp_path {workdir}/nginx-tmp/client_body;
    proxy_temp_path {workdir}/nginx-tmp/proxy;
    fastcgi_temp_path {workdir}/nginx-tmp/fastcgi;
    uwsgi_temp_path {workdir}/nginx-tmp/uwsgi;
    scgi_temp_path {workdir}/nginx-tmp/scgi;

    upstream sim {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
        keepalive_requests 1000000;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    """``nginx`` on PATH, else /usr/sbin/nginx; None when neither is there."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


def nginx_version(binary: str) -> str:
    """What ``nginx -v`` prints (on stderr), e.g. ``nginx/1.22.1``."""
    done = subprocess.run([binary, "-v"], capture_output=True, timeout=10, check=False)
    text = (done.stderr or done.stdout).decode(errors="replace").strip()
    return text.removeprefix("nginx version: ")


def free_port() -> int:
    """A port free on 127.0.0.1 just now (for a server that cannot bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/<pid>/stat after the comm: state is [0], ppid [1], utime [11], stime [12]."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.rindex(b")") + 2 :].split()


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (a scan of /proc: bounded by its entries)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry.name))[1]) == pid:
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return out


class Nginx(Child):
    """A plain nginx reverse proxy to ``upstream_port`` (the bench's reference).

    The master runs in the foreground (``daemon off``), so it is this child
    process; its one worker serves. CPU is master + worker; RSS figures are
    the worker's. Config, logs, pid and temp paths live in ``workdir``.
    """

    def __init__(
        self,
        binary: str,
        workdir: Path,
        upstream_port: int,
        env: dict[str, str],
        cpus: set[int] | None = None,
    ) -> None:
        port = free_port()
        conf = workdir / "nginx.conf"
        (workdir / "nginx-tmp").mkdir(exist_ok=True)  # nginx makes only the last level
        conf.write_text(NGINX_CONF.format(workdir=workdir, upstream_port=upstream_port, port=port))
        argv = [binary, "-p", f"{workdir}/", "-c", str(conf), "-g", "daemon off;"]
        super().__init__("nginx", argv, workdir, env, cpus=cpus)
        self.port = port
        self.worker_pid = 0
        self._worker_start = b""

    def wait_serving(self, timeout_s: float = 15) -> int:
        """Poll (bounded) until a GET through nginx reaches the upstream; find the worker."""

        def serving() -> bool:
            if self.proc.poll() is not None:
                return True  # exited: stop polling, fail below
            try:
                url = f"http://127.0.0.1:{self.port}/health"
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        if eventually(serving, timeout_s) and self.proc.poll() is None:
            workers = _children(self.pid)
            if len(workers) == 1:
                self.worker_pid = workers[0]
                self._worker_start = _stat_fields(self.worker_pid)[19]  # starttime
                return self.port
        log = self.stdout_path.parent / "nginx-error.log"
        tail = b"".join(p.read_bytes()[-2000:] for p in (self.stderr_path, log) if p.exists())
        raise RuntimeError(f"nginx did not start serving:\n{tail.decode(errors='replace')}")

    def cpu_s(self) -> float:
        """utime + stime of the master and its worker, in seconds."""
        fields = _stat_fields(self.worker_pid)
        return super().cpu_s() + (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def thread_cpu_s(self) -> float:
        """utime + stime of threads other than the master's and the worker's main ones."""
        total = 0
        for task in Path(f"/proc/{self.worker_pid}/task").iterdir():
            if task.name == str(self.worker_pid):
                continue
            try:
                fields = _stat_fields(int(task.name))
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])
        return super().thread_cpu_s() + total / _CLK_TCK

    def status_kb(self, key: str) -> int:
        """The worker's /proc status figure (``VmHWM``: the serving process's peak)."""
        for line in Path(f"/proc/{self.worker_pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def reset_peak_rss(self) -> bool:
        """Reset the worker's VmHWM (``clear_refs`` "5"); False when refused."""
        try:
            Path(f"/proc/{self.worker_pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def stop(self, timeout_s: float = 8, sig: int = signal.SIGTERM) -> None:
        """Stop the master (it stops its worker); SIGKILL the worker, by PID, if it
        outlived a killed master (the same process: its start time matches)."""
        super().stop(timeout_s, sig)
        if not self.worker_pid:
            return
        try:
            if _stat_fields(self.worker_pid)[19] != self._worker_start:
                return  # exited; the PID is someone else's now
            os.kill(self.worker_pid, signal.SIGKILL)
        except (OSError, IndexError):
            return  # already gone
