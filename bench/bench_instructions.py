"""Instructions per streamed request, counted by valgrind: a figure that noise cannot move.

Run: ``.venv/bin/python -m bench.bench_instructions`` (needs ``valgrind``).
CPU seconds on this shared VM swing by a third from run to run, more than
most single changes are worth. Here the gateway runs under ``valgrind
--tool=callgrind`` with instrumentation off; after startup and a warm-up, the
counting is switched on (``callgrind_control -i on``) for ``--requests``
sequential streamed chats (16 chunks, the ``latency`` scenario of
``bench.run``, same config and credentials), until their receipts are on
disk, then off. The total counted, over all the gateway's threads, divided
by the requests is the figure. It counts instructions, not cycles: a
syscall's kernel side and cache misses are not in it.

What the gateway does by the clock rather than per request (the readiness
poll every ``readiness_poll_s``, timers) lands in the window too, in
proportion to its wall time, which under valgrind on a shared machine
varies from run to run (15-36 s for the same 100 requests): the raw figure
then moved by ±2 %. So the idle gateway is counted first for ``--idle``
seconds (a dump of its own), and the measured window's count less that
rate times its wall time is the figure printed as ``corrected``; the raw
one is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.loadgen import close_connections, open_connections, run_load
from bench.procs import Child, gateway_command, start_simulator, wait_ready
from bench.run import DONE, FIRST_CONTENT, PATHS, _config, _payloads, _settle, _tokens
from gateway.testing.harness import DEMO_SECRET_ENV, new_dev_secret
from gateway.testing.simulator.server import loop_factory

#: a dump's own count ("summary:" is not: after a mid-run dump it is relative)
_TOTALS = re.compile(rb"^totals: (\d+)", re.MULTILINE)


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, stdout=subprocess.DEVNULL)


def _dump_total(path: Path) -> int:
    return sum(int(n) for n in _TOTALS.findall(path.read_bytes()))


def count(
    requests: int,
    chunks: int,
    keep: Path | None = None,
    idle_s: float = 0.0,
    delay_ms: float = 0.0,
    api: str = "chat",
) -> tuple[float, int, float]:
    """(instructions per request, requests that ended with [DONE], the same
    less the idle gateway's rate over the window's wall time); ``keep``: copy
    the callgrind files there (``callgrind_annotate`` reads them)."""
    workdir = Path(tempfile.mkdtemp(prefix="gateway-instr-"))
    out = workdir / "callgrind.out"
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    try:
        sim = start_simulator(workdir, env)
        children.append(sim)
        config = _config(workdir, sim.port, 64)
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}.%p", *gateway_command(),
                "serve", "--config", str(config), "--port", "0"]  # fmt: skip
        gateway = Child("gateway", argv, workdir, env)
        children.append(gateway)
        gateway.wait_listening(timeout_s=300)
        wait_ready(gateway.port, timeout_s=120)
        receipts = workdir / "var" / "receipts.jsonl"
        payload = _payloads(
            gateway.port,
            True,
            f"[[sim chunks={chunks} delay_ms={delay_ms:g}]]",
            _tokens(secret),
            [],
            api,
        )
        run = asyncio.Runner(loop_factory=loop_factory())
        with run:
            conns = run.run(open_connections(gateway.port, 1))
            try:

                def load(total: int) -> int:
                    result = run.run(
                        run_load(gateway.port, payload, total=total, concurrency=1,
                                 request_timeout_s=60, budget_s=600, connections=conns,
                                 first_content=FIRST_CONTENT[api], done_tail=DONE[api])
                    )  # fmt: skip
                    return len(result.ok)

                load(20)  # warm-up: pools, caches, the first imports of the request path
                written = _settle(receipts, 20, timeout_s=60)
                idle_wall = 0.0
                if idle_s > 0:
                    # The idle gateway's clock-driven work: dump 1.
                    _control("-i", "on", str(gateway.pid))
                    idle_began = time.monotonic()
                    time.sleep(idle_s)  # the measured idle period itself
                    _control("-d", str(gateway.pid))
                    idle_wall = time.monotonic() - idle_began
                else:
                    _control("-i", "on", str(gateway.pid))
                began = time.monotonic()
                ok = load(requests)
                _settle(receipts, written + requests, timeout_s=60)
                _control("-i", "off", str(gateway.pid))
                wall = time.monotonic() - began
            finally:
                close_connections(conns)
        _control("-d", str(gateway.pid))
        gateway.stop(timeout_s=120)
        dumps = list(workdir.glob("callgrind.out.*"))
        total = sum(_dump_total(dump) for dump in dumps)
        idle = 0
        if idle_s > 0:
            # The idle window's dump is the first numbered one.
            first = workdir / f"callgrind.out.{gateway.pid}.1"
            idle = _dump_total(first)
            total -= idle
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for dump in dumps:
                shutil.copy(dump, keep / dump.name)
        idle_rate = idle / idle_wall if idle_wall else 0.0
        return total / requests, ok, (total - idle_rate * wall) / requests
    finally:
        for child in reversed(children):
            child.stop(timeout_s=120)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--keep", type=Path, help="copy the callgrind files into this folder")
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="the simulator's pause between chunks (each chunk its own read)",
    )
    parser.add_argument(
        "--idle", type=float, default=10.0, help="seconds of idle counting (0: no correction)"
    )
    parser.add_argument(
        "--api", choices=sorted(PATHS), default="chat", help="the endpoint streamed (bench.run's)"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: no instruction count (Debian: apt-get install valgrind)")
        return 0
    started = time.monotonic()
    per_request, ok, corrected = count(
        args.requests, args.chunks, args.keep, args.idle, args.delay_ms, args.api
    )
    took = time.monotonic() - started
    spaced = f", {args.delay_ms:g} ms apart" if args.delay_ms else ""
    print(f"gateway instructions per streamed {args.api} request "
          f"({args.chunks} chunks{spaced}, C=1): "
          f"{per_request / 1e6:.3f} M, corrected {corrected / 1e6:.3f} M "
          f"({ok}/{args.requests} ok, {took:.0f} s under valgrind)")  # fmt: skip
    return 0 if ok == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
