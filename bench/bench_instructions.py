"""Instructions per streamed request, counted by valgrind: a figure that noise cannot move.

Run: ``.venv/bin/python -m bench.bench_instructions`` (needs ``valgrind``).
CPU seconds on this shared VM swing by a third from run to run, more than
most single changes are worth. Here the gateway runs under ``valgrind
--tool=callgrind`` with instrumentation off; after startup and a warm-up, the
counting is switched on (``callgrind_control -i on``) for ``--requests``
sequential streamed chats (16 chunks, the ``latency`` scenario of
``bench.run``, same config and credentials), until their receipts are on
disk, then off. The total counted, over all the gateway's threads, divided
by the requests is the figure: the same code gives the same count to within
a fraction of a percent, whatever else the machine is doing. It counts
instructions, not cycles: a syscall's kernel side and cache misses are not
in it.
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
from bench.run import _config, _payloads, _settle, _tokens
from gateway.testing.harness import DEMO_SECRET_ENV, new_dev_secret
from gateway.testing.simulator.server import loop_factory

_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, stdout=subprocess.DEVNULL)


def count(requests: int, chunks: int, keep: Path | None = None) -> tuple[float, int]:
    """(instructions per request, requests that ended with [DONE]); ``keep``:
    copy the callgrind files there (``callgrind_annotate`` reads them)."""
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
            gateway.port, True, f"[[sim chunks={chunks}]]", _tokens(secret), [], "chat"
        )
        run = asyncio.Runner(loop_factory=loop_factory())
        with run:
            conns = run.run(open_connections(gateway.port, 1))
            try:

                def load(total: int) -> int:
                    result = run.run(
                        run_load(gateway.port, payload, total=total, concurrency=1,
                                 request_timeout_s=60, budget_s=600, connections=conns)
                    )  # fmt: skip
                    return len(result.ok)

                load(20)  # warm-up: pools, caches, the first imports of the request path
                written = _settle(receipts, 20, timeout_s=60)
                _control("-i", "on", str(gateway.pid))
                ok = load(requests)
                _settle(receipts, written + requests, timeout_s=60)
                _control("-i", "off", str(gateway.pid))
            finally:
                close_connections(conns)
        _control("-d", str(gateway.pid))
        gateway.stop(timeout_s=120)
        total = sum(
            int(n)
            for dump in workdir.glob("callgrind.out.*")
            for n in _TOTALS.findall(dump.read_bytes())
        )
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for dump in workdir.glob("callgrind.out.*"):
                shutil.copy(dump, keep / dump.name)
        return total / requests, ok
    finally:
        for child in reversed(children):
            child.stop(timeout_s=120)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--keep", type=Path, help="copy the callgrind files into this folder")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: no instruction count (Debian: apt-get install valgrind)")
        return 0
    started = time.monotonic()
    per_request, ok = count(args.requests, args.chunks, args.keep)
    print(f"gateway instructions per streamed chat request ({args.chunks} chunks, C=1): "
          f"{per_request / 1e6:.3f} M ({ok}/{args.requests} ok, "
          f"{time.monotonic() - started:.0f} s under valgrind)")  # fmt: skip
    return 0 if ok == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
