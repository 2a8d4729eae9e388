"""What a release costs on the hot path (spec §18, issue 23): one gateway, one
simulator serving two routes as two upstreams, and two aliases of one tenant:
``plain`` (the stable route itself) and ``rel`` (``release:chat``, 50 % canary
by request id, a gate on). The same latency scenario (C=1, 16 chunks) runs
through each alias in turn, twice (ABAB: drift between runs shows), and the
gateway's CPU per request is compared. Target: ≤ +0.05 ms CPU per request.

    python -m bench.bench_release [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.alternate import Payloads, alternate, mean_cpu
from bench.loadgen import http_post
from bench.run import AUDIENCE, HS_ISSUER, TENANT, Scenario, _body
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    SIM_ROUTE,
    default_policy,
    write_config,
)

CANARY_ROUTE = SIM_ROUTE + "-canary"
TARGET_MS = 0.05


def _config(workdir: Path, port: int) -> Path:
    policy = default_policy(
        TENANT,
        models={"plain": SIM_ROUTE, "rel": "release:chat"},
        limits={"max_output_tokens": 512, "requests_per_minute": 10_000_000},
        admission={"share": 1, "max_permits": 64, "queue_timeout_s": 10},
    )
    base = f"http://127.0.0.1:{port}"
    fast = {"readiness_poll_s": 2, "readiness_timeout_s": 2}
    return write_config(
        workdir,
        upstream_port=port,
        policies={TENANT: policy},
        issuers=[
            {
                "issuer": HS_ISSUER,
                "audience": AUDIENCE,
                "algorithms": ["HS256"],
                "hs256_secret_env": DEMO_SECRET_ENV,
            }
        ],
        upstreams=[
            {"name": "stable", "base_url": base, "routes": [SIM_ROUTE], **fast},
            {"name": "canary", "base_url": base, "routes": [CANARY_ROUTE], **fast},
        ],
        releases=[
            {
                "name": "chat",
                "stable": SIM_ROUTE,
                "canary": CANARY_ROUTE,
                "canary_percent": 50,
                "cohort": "request",
                "gate": {"window_s": 300, "min_requests": 20},
            }
        ],
        admission={"capacity": 64, "max_queue": 64},
        audit={"path": "var/receipts.jsonl"},
    )


def _payloads(port: int, token: str, alias: str, directive: str) -> Callable[[int], bytes]:
    request = http_post(
        port,
        "/v1/chat/completions",
        _body(alias, f"bench {directive}", [], "chat"),
        {"authorization": f"Bearer {token}"},
    )
    return lambda _i: request


def run_release(quick: bool) -> dict[str, Any]:
    # 1,000 requests a run: a clock tick (10 ms) is then 0.01 ms per request
    total = 20 if quick else 1000
    budget_s, timeout_s = (15.0, 10.0) if quick else (60.0, 30.0)

    def variant(alias: str) -> Payloads:
        return lambda port, token: (
            _payloads(port, token, alias, "[[sim chunks=16 delay_ms=0]]"),
            _payloads(port, token, alias, "[[sim chunks=2 delay_ms=0]]"),
        )

    runs = alternate(
        "release",
        [SIM_ROUTE, CANARY_ROUTE],
        _config,
        {"plain": variant("plain"), "rel": variant("rel")},
        Scenario("release_latency", 1, total, 16),
        budget_s=budget_s,
        timeout_s=timeout_s,
    )
    cpu = {a: [r["cpu_s_per_1000"] for r in rs] for a, rs in runs.items()}
    mean = mean_cpu(runs)
    return {
        "runs": runs,
        "cpu_s_per_1000": cpu,
        # s per 1,000 requests is ms per request
        "release_minus_plain_ms_cpu_per_request": round(mean["rel"] - mean["plain"], 4),
        "target_ms": TARGET_MS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_release", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    args = parser.parse_args(argv)
    report = run_release(args.quick)
    for alias in ("plain", "rel"):
        figures = report["runs"][alias]
        print(
            f"{alias:5s} CPU s/1000: {', '.join(str(f['cpu_s_per_1000']) for f in figures)}; "
            f"TTFT p50 ms: {', '.join(str(f['ttft_p50_ms']) for f in figures)}; "
            f"ok {sum(f['ok'] for f in figures)}/{sum(f['sent'] for f in figures)}"
        )
    delta = report["release_minus_plain_ms_cpu_per_request"]
    print(f"release - plain: {delta:+.4f} ms CPU per request (target <= +{TARGET_MS} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
