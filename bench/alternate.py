"""Variants of one scenario through one gateway, run in turn (ABAB…): what a
feature costs a request, with the drift between runs in plain sight.

One simulator (the routes given), one ``serve`` child on the config the
bench writes, one HS256 token; each round runs every variant once, in order,
with its own warm-up. ``bench_release`` and ``bench_agents`` are its users.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.procs import Child, gateway_command, wait_ready
from bench.run import Scenario, _measure, _tokens
from gateway.testing.harness import DEMO_SECRET_ENV, new_dev_secret

#: a variant's (measured, warm-up) payloads, given the gateway's port and a token
Payloads = Callable[[int, str], tuple[Callable[[int], bytes], Callable[[int], bytes]]]


def alternate(
    prefix: str,
    routes: list[str],
    config: Callable[[Path, int], Path],
    variants: Mapping[str, Payloads],
    scenario: Scenario,
    *,
    rounds: int = 2,
    budget_s: float,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every variant's figures (``bench.run._measure``), one per round."""
    workdir = Path(tempfile.mkdtemp(prefix=f"gateway-bench-{prefix}-"))
    secret = new_dev_secret()
    environ = {**os.environ, **(env or {}), DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    try:
        argv = [sys.executable, "-m", "gateway.testing.simulator", "--port", "0"]
        for route in routes:
            argv += ["--model-id", route]
        sim = Child("simulator", argv, workdir, environ)
        children.append(sim)
        sim.wait_listening()
        serve = ["serve", "--config", str(config(workdir, sim.port)), "--port", "0"]
        gw = Child("gateway", [*gateway_command(), *serve], workdir, environ)
        children.append(gw)
        gw.wait_listening()
        wait_ready(gw.port)
        token = _tokens(secret)[1]
        for _ in range(rounds):
            for name, payloads in variants.items():
                measured, warm = payloads(gw.port, token)
                receipts = workdir / "var" / "receipts.jsonl"
                runs[name].append(
                    _measure(scenario, gw, sim, measured, warm, budget_s, timeout_s, receipts)
                )
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def mean_cpu(runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Each variant's mean CPU seconds per 1,000 requests (= ms per request)."""
    return {name: sum(r["cpu_s_per_1000"] for r in rs) / len(rs) for name, rs in runs.items()}
