"""What the HTTP server costs per streamed request: uvicorn versus granian.

The same tiny ASGI app (:func:`app`: read the body, stream 16 SSE events and
``[DONE]``, one ``http.response.body`` each) is served by uvicorn (uvloop,
httptools, one worker) and by granian (asgi, one worker, one runtime thread,
uvloop), each a child process pinned to one CPU, on 127.0.0.1. The load client
(:mod:`bench.loadgen`, kept-alive HTTP/1.1) runs here, on another CPU. CPU is
utime+stime of the server's process tree (granian: supervisor and worker);
peak RSS is the sum of their VmHWM. Without granian, uvicorn alone is measured.

    PYTHONPATH=. python -m bench.bench_server [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.loadgen import LoadResult, close_connections, http_post, open_connections, run_load

Scope = dict[str, Any]
Message = dict[str, Any]

ROOT = Path(__file__).resolve().parent.parent
EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_CLK_TCK = os.sysconf("SC_CLK_TCK")
new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
with contextlib.suppress(ImportError):  # the client on uvloop too: less overhead at C=64
    from uvloop import new_event_loop as new_loop


async def app(
    scope: Scope,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    """POST anything: 200 ``text/event-stream``, 16 events, then ``[DONE]``."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    more = True
    while more:  # the whole request body
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    for _ in range(16):
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
    await send({"type": "http.response.body", "body": DONE, "more_body": False})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(server: str, port: int) -> list[str]:
    common = f"--host 127.0.0.1 --port {port} --log-level warning --no-access-log".split()
    if server == "uvicorn":
        opts = "uvicorn bench.bench_server:app --loop uvloop --http httptools --workers 1"
        return [sys.executable, "-m", *opts.split(), *common]
    opts = "granian --interface asgi --workers 1 --runtime-threads 1 --loop uvloop"
    return [sys.executable, "-m", *opts.split(), *common, "bench.bench_server:app"]


def _stat(pid: int) -> list[bytes]:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.rindex(b")") + 2 :].split()  # [0] is the state


def tree(root: int) -> list[int]:
    """``root`` and its descendants (one scan of /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue
    found = [root]
    for pid in found:  # grows while walking; bounded by the process count
        found += [child for child, parent in parents.items() if parent == pid]
    return found


def cpu_s(pids: list[int]) -> float:
    return sum(int(_stat(pid)[11]) + int(_stat(pid)[12]) for pid in pids) / _CLK_TCK  # utime+stime


def hwm_mb(pids: list[int]) -> float:
    lines = [ln for pid in pids for ln in Path(f"/proc/{pid}/status").read_text().splitlines()]
    return sum(int(ln.split()[1]) for ln in lines if ln.startswith("VmHWM:")) / 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def wait_serving(port: int, proc: subprocess.Popen[bytes], payload: bytes) -> None:
    """Until one full streamed request succeeds; bounded by a 30 s deadline."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conns = await asyncio.wait_for(open_connections(port, 1), 2)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.02)  # poll interval, not a readiness guess
            continue
        kw: dict[str, Any] = dict(concurrency=1, request_timeout_s=5, connections=conns)
        load = await run_load(port, lambda _: payload, total=1, budget_s=5, **kw)
        close_connections(conns)
        if load.ok:
            return
    raise RuntimeError(f"server on port {port} did not serve (exit {proc.poll()})")


async def scenario(
    port: int, pids: list[int], payload: bytes, conc: int, total: int, warm: int
) -> dict[str, float]:
    conns = await open_connections(port, conc)
    try:
        kw: dict[str, Any] = dict(concurrency=conc, request_timeout_s=30, connections=conns)
        await run_load(port, lambda _: payload, total=warm, budget_s=60, **kw)
        before = cpu_s(pids)
        load: LoadResult = await run_load(port, lambda _: payload, total=total, budget_s=300, **kw)
        cpu = cpu_s(pids) - before
    finally:
        close_connections(conns)
    ok = load.ok
    if len(ok) != total:
        print(f"  errors: {load.errors()}", file=sys.stderr)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None] or [float("nan")]
    return {
        "cpu": cpu / max(1, len(ok)) * 1000,
        "p50": pct(ttft, 0.5) * 1000,
        "p99": pct(ttft, 0.99) * 1000,
        "rps": len(ok) / load.wall_s if load.wall_s else 0.0,
        "rss": hwm_mb(pids),
    }


def stop(proc: subprocess.Popen[bytes], pids: dict[int, bytes]) -> None:
    """SIGTERM, bounded wait, SIGKILL; then a leftover descendant by its PID (same start time)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for pid, started in pids.items():
        with contextlib.suppress(OSError, IndexError):
            if pid != proc.pid and _stat(pid)[19] == started:
                os.kill(pid, signal.SIGKILL)


def run_server(
    server: str,
    cpus: tuple[set[int] | None, set[int] | None],
    scenarios: list[tuple[int, int]],
    warm: int,
    body: str,
) -> list[dict[str, float]]:
    port = free_port()
    payload = http_post(port, "/v1/chat/completions", body.encode(), {})
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    server_cpu = cpus[0]

    def pin() -> None:
        if server_cpu:
            os.sched_setaffinity(0, server_cpu)

    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            server_argv(server, port), stdout=log, stderr=log, env=env, cwd=ROOT, preexec_fn=pin
        )
        pids = {proc.pid: b""}
        try:
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(wait_serving(port, proc, payload))
                pids = {pid: _stat(pid)[19] for pid in tree(proc.pid)}  # field 22: start time
                return [
                    runner.run(scenario(port, [*pids], payload, c, n, warm)) for c, n in scenarios
                ]
        except RuntimeError:
            log.seek(0)
            print(log.read()[-2000:].decode(errors="replace"), file=sys.stderr)
            raise
        finally:
            stop(proc, pids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny counts: a smoke run")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    scenarios = [(1, 60), (8, 80)] if args.quick else [(1, 3000), (64, 4000)]
    warm = 20 if args.quick else 200
    rounds = 1 if args.quick else max(1, min(args.rounds, 10))
    servers = ["uvicorn"]
    try:
        import granian  # type: ignore[import-not-found,unused-ignore]

        servers.append("granian")
        print(f"granian {granian.__version__}", end="; ")
    except ImportError:
        print("granian is not importable here: measuring uvicorn alone")
    import uvicorn

    print(f"uvicorn {uvicorn.__version__}, python {sys.version.split()[0]}")
    all_cpus = sorted(os.sched_getaffinity(0))  # Linux only, as is /proc
    cpus: tuple[set[int] | None, set[int] | None] = (None, None)
    if len(all_cpus) >= 2:
        cpus = ({all_cpus[0]}, {all_cpus[1]})
        os.sched_setaffinity(0, cpus[1])
    msg = {"role": "user", "content": "x" * 110}
    body = json.dumps({"model": "bench", "stream": True, "max_tokens": 16, "messages": [msg]})
    print(f"request body {len(body)} B; server CPU {cpus[0]}, client CPU {cpus[1]}")
    head = ("server", "round", "scenario", "CPU s/1k", "TTFT p50", "p99 ms", "req/s", "RSS MB")
    print("{:9} {:>5} {:>11} {:>9} {:>9} {:>8} {:>8} {:>7}".format(*head))
    for rnd in range(1, rounds + 1):
        for server in servers:
            rows = run_server(server, cpus, scenarios, warm, body)
            for (conc, total), row in zip(scenarios, rows, strict=True):
                print(
                    f"{server:9} {rnd:>5} {f'C={conc}x{total}':>11} {row['cpu']:>9.3f} "
                    f"{row['p50']:>9.3f} {row['p99']:>8.3f} {row['rps']:>8.0f} "
                    f"{row['rss']:>7.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
