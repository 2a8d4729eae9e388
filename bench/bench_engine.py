"""The gateway on the real engine: tokens/s through it ÷ direct, its CPU per 1,000 tokens.

Run: ``.venv/bin/python -m bench.bench_engine [--pairs N] [--max-tokens T] [--size small]``.

Two child processes on 127.0.0.1: the adapter around the real mistral.rs
engine (test equipment, ``gateway/testing/engine``) on the generated
random-weight ``small`` model (~25M parameters), and ``mistralrs-gateway
serve`` in front of it (uvicorn + uvloop + httptools, receipts and metrics
on, the deployed readiness poll). This process is the client (httpx,
streaming, greedy, one request at a time): one unmeasured request each way,
then ``pairs`` x (gateway, direct) runs alternating, each ``requests`` streams
of ``max_tokens`` tokens. Per run: completion tokens (the engine's usage),
wall seconds (request sent → end of body), tokens/s, the gateway's CPU
seconds per 1,000 tokens (``/proc/<pid>/stat`` over the run) and the
engine's. Every stream must end with ``[DONE]`` and report ``max_tokens``
tokens, else the run fails. Bounded: fixed counts, request timeouts, both
children stopped by PID in ``finally``.

Short runs, finely interleaved (default 10 pairs of one 256-token stream),
because the engine's speed drifts with whatever else the machine runs: longer
runs (4 pairs of 2 streams) gave ratios from 0.76 to 1.12 between invocations
on a shared 2-core machine, the interleaved default 0.99-1.0. The ratio is a
figure to read, not a test: the gateway's CPU per token is the stable measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Child, wait_ready
from gateway.auth.authenticator import mint_dev_token
from gateway.config.loader import load_config
from gateway.testing.engine.process import EngineAdapter, cpu_seconds, start_adapter
from gateway.testing.harness import DEMO_SECRET_ENV, default_policy, new_dev_secret, write_config

ALIAS = "random-llama"
TARGET = 0.97
PROMPT = "Tell me a story about the sea."


@dataclass
class Run:
    target: str  # gateway | direct
    tokens: int
    seconds: float
    gateway_cpu_s: float
    engine_cpu_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def per_1000(self, cpu_s: float) -> float:
        return cpu_s / self.tokens * 1000


def _config(workdir: Path, adapter: EngineAdapter) -> Path:
    policy = default_policy(
        "bench",
        models={ALIAS: adapter.route},
        modalities=["text"],
        limits={"max_output_tokens": 2048, "requests_per_minute": 1_000_000},
    )
    return write_config(
        workdir,
        upstream_port=adapter.port,
        policies={"bench": policy},
        upstream={"route": adapter.route, "readiness_poll_s": 2, "readiness_timeout_s": 10},
        metrics={"path": "/metrics"},
    )


def _stream(client: httpx.Client, url: str, body: dict[str, Any], max_tokens: int) -> int:
    """One streaming request to the end; its completion tokens (checked)."""
    usage: dict[str, Any] | None = None
    done = False
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {response.read()[:200]!r}")
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"{url}: stream error {chunk['error']}")
                usage = chunk.get("usage") or usage
    if not done or usage is None or usage["completion_tokens"] != max_tokens:
        raise RuntimeError(f"{url}: the stream did not end whole ({done=}, {usage=})")
    return int(usage["completion_tokens"])


def _run(
    target: str,
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    args: argparse.Namespace,
    gateway: Child,
    adapter: EngineAdapter,
) -> Run:
    gw0, en0 = gateway.cpu_s(), cpu_seconds(adapter.pid)
    started = time.monotonic()
    tokens = sum(_stream(client, url, body, args.max_tokens) for _ in range(args.requests))
    seconds = time.monotonic() - started
    return Run(target, tokens, seconds, gateway.cpu_s() - gw0, cpu_seconds(adapter.pid) - en0)


def _table(runs: list[Run]) -> str:
    head = f"{'run':>3}  {'target':<7}  {'tokens':>6}  {'seconds':>7}  {'tok/s':>7}  "
    head += f"{'gateway CPU s/1k tok':>20}  {'engine CPU s/1k tok':>19}"
    lines = [head, "-" * len(head)]
    for number, run in enumerate(runs, 1):
        # on a direct run the gateway is idle (its readiness poll only)
        gateway_cpu = f"{run.per_1000(run.gateway_cpu_s):.3f}"
        if run.target == "direct":
            gateway_cpu = f"({gateway_cpu} idle)"
        lines.append(
            f"{number:>3}  {run.target:<7}  {run.tokens:>6}  {run.seconds:>7.2f}  "
            f"{run.tokens_per_s:>7.1f}  {gateway_cpu:>20}  "
            f"{run.per_1000(run.engine_cpu_s):>19.3f}"
        )
    return "\n".join(lines)


def summary(runs: list[Run]) -> dict[str, Any]:
    gw = [r for r in runs if r.target == "gateway"]
    direct = [r for r in runs if r.target == "direct"]
    gw_rate = statistics.median(r.tokens_per_s for r in gw)
    direct_rate = statistics.median(r.tokens_per_s for r in direct)
    pairs = [g.tokens_per_s / d.tokens_per_s for g, d in zip(gw, direct, strict=True)]
    totals = (sum(r.tokens for r in gw) / sum(r.seconds for r in gw)) / (
        sum(r.tokens for r in direct) / sum(r.seconds for r in direct)
    )
    return {
        "gateway_tok_s_median": round(gw_rate, 1),
        "direct_tok_s_median": round(direct_rate, 1),
        "ratio": round(gw_rate / direct_rate, 3),
        "ratio_of_totals": round(totals, 3),
        "median_pair_ratio": round(statistics.median(pairs), 3),
        "pair_ratios": [round(r, 3) for r in pairs],
        "target": TARGET,
        "gateway_cpu_s_per_1000_tokens": round(
            statistics.median(r.per_1000(r.gateway_cpu_s) for r in gw), 3
        ),
        "engine_cpu_s_per_1000_tokens": {
            "through_gateway": round(statistics.median(r.per_1000(r.engine_cpu_s) for r in gw), 3),
            "direct": round(statistics.median(r.per_1000(r.engine_cpu_s) for r in direct), 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_engine", description=__doc__)
    parser.add_argument("--size", choices=("tiny", "small"), default="small")
    parser.add_argument("--pairs", type=int, default=10, help="(gateway, direct) run pairs")
    parser.add_argument("--requests", type=int, default=1, help="streams per run")
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if not (1 <= args.pairs <= 50 and 1 <= args.requests <= 100 and 1 <= args.max_tokens <= 1900):
        parser.error("pairs 1-50, requests 1-100, max-tokens 1-1900")

    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "GATEWAY_LOG_LEVEL": "warning"}
    adapter = start_adapter(args.size)
    gateway: Child | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
            workdir = Path(tmp)
            config = _config(workdir, adapter)
            argv_serve = [
                sys.executable,
                "-m",
                "gateway.tools.cli",
                "serve",
                "--config",
                str(config),
            ]
            gateway = Child("gateway", [*argv_serve, "--port", "0"], workdir, env)
            port = gateway.wait_listening()
            gw_url = f"http://127.0.0.1:{port}"
            wait_ready(port, 30)
            token = mint_dev_token(
                load_config(config).auth, "bench", scopes=["inference"], ttl_s=3600,
                env={DEMO_SECRET_ENV: secret},
            )  # fmt: skip
            body = {
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},  # what the gateway asks anyway
            }
            targets = {
                "gateway": (gw_url, {**body, "model": ALIAS}, {"authorization": f"Bearer {token}"}),
                "direct": (adapter.base_url, body, {}),
            }
            runs: list[Run] = []
            clients = {
                name: httpx.Client(headers=h, timeout=300) for name, (_, _, h) in targets.items()
            }
            try:
                for name, (url, payload, _) in targets.items():  # warm-up, unmeasured
                    _stream(clients[name], url, payload, args.max_tokens)
                for _ in range(args.pairs):
                    for name in ("gateway", "direct"):
                        url, payload, _ = targets[name]
                        runs.append(_run(name, clients[name], url, payload, args, gateway, adapter))
            finally:
                for client in clients.values():
                    client.close()
    finally:
        if gateway is not None:
            gateway.stop()
        adapter.stop()
    print(
        f"engine lane: {args.size} model (random weights), {args.pairs} pairs x {args.requests} "
        f"streams x {args.max_tokens} tokens, greedy, one stream at a time\n"
    )
    print(_table(runs))
    result = summary(runs)
    print()
    print(
        f"tokens/s through the gateway / direct: {result['ratio']} (medians of runs; "
        f"target >= {TARGET}); of totals {result['ratio_of_totals']}; "
        f"per pair {result['pair_ratios']}, median {result['median_pair_ratio']}"
    )
    print(f"gateway CPU s per 1,000 tokens: {result['gateway_cpu_s_per_1000_tokens']}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
