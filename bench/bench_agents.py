"""What an agentic request costs the gateway (spec §22, issue 33): one gateway in
front of the simulator's tool loop (test equipment: its rounds, approvals and
sessions byte for byte), one route with agents, one tenant whose policy
decides alone. The latency scenario (C=1, 16 chunks) runs as a plain chat,
then as an agentic chat of 1 and of 4 rounds (each round a page extraction on
a pinned public name: the rules, the pinned lookup and the decision's post to
the worker), alternating twice. The gateway's CPU per request of each, and
per round (the 1-to-4-round slope), are printed.

    python -m bench.bench_agents [--quick]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.alternate import Payloads, alternate, mean_cpu
from bench.loadgen import http_post
from bench.run import AUDIENCE, HS_ISSUER, TENANT, Scenario
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    SIM_ROUTE,
    default_policy,
    new_dev_secret,
    write_config,
)

SESSION_ENV = "GATEWAY_BENCH_AGENT_SESSION_KEY"
HOST = "docs.example.com"


def _config(workdir: Path, port: int) -> Path:
    policy = default_policy(
        TENANT,
        limits={"max_output_tokens": 512, "requests_per_minute": 10_000_000},
        agents={
            "tools": ["web_search"],
            "web": {"allowed_domains": [HOST]},
            "max_tool_rounds": 8,
        },
    )
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
        upstream={
            "agents": {"web_search": True, "max_tool_rounds": 8},
            "readiness_poll_s": 2,
            "readiness_timeout_s": 2,
        },
        agents={"session_key_env": SESSION_ENV, "hosts": {HOST: ["93.184.216.34"]}},
        admission={"capacity": 64, "max_queue": 64},
        audit={"path": "var/receipts.jsonl"},
    )


def _payloads(port: int, token: str, rounds: int, chunks: int) -> Callable[[int], bytes]:
    body: dict[str, Any] = {
        "model": "gemma-4-mm",
        "stream": True,
        "max_tokens": 128,
    }
    directive = f"chunks={chunks} delay_ms=0"
    if rounds:
        plan = ",".join(f"url:https://{HOST}/page{r}" for r in range(rounds))
        directive += f" agent={plan} round_chunks=1"
        body["web_search_options"] = {}
    body["messages"] = [{"role": "user", "content": f"bench [[sim {directive}]]"}]
    request = http_post(
        port, "/v1/chat/completions", orjson.dumps(body), {"authorization": f"Bearer {token}"}
    )
    return lambda _i: request


def run_agents(quick: bool) -> dict[str, Any]:
    total = 20 if quick else 300
    budget_s, timeout_s = (15.0, 10.0) if quick else (120.0, 30.0)

    def variant(rounds: int) -> Payloads:
        return lambda port, token: (
            _payloads(port, token, rounds, 16),
            _payloads(port, token, rounds, 2),
        )

    runs = alternate(
        "agents",
        [SIM_ROUTE],
        _config,
        {"plain": variant(0), "agent_1": variant(1), "agent_4": variant(4)},
        Scenario("agents_latency", 1, total, 16),
        budget_s=budget_s,
        timeout_s=timeout_s,
        env={SESSION_ENV: new_dev_secret()},
    )
    mean = mean_cpu(runs)
    return {
        "runs": runs,
        "cpu_s_per_1000": {k: [r["cpu_s_per_1000"] for r in rs] for k, rs in runs.items()},
        # s per 1,000 requests is ms per request
        "agent_1_minus_plain_ms_cpu_per_request": round(mean["agent_1"] - mean["plain"], 4),
        "ms_cpu_per_round": round((mean["agent_4"] - mean["agent_1"]) / 3, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_agents", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    args = parser.parse_args(argv)
    report = run_agents(args.quick)
    for kind, figures in report["runs"].items():
        for run in figures:
            print(
                f"{kind:>8}: CPU {run['cpu_s_per_1000']:.3f} s per 1,000 requests, "
                f"TTFT p50 {run['ttft_p50_ms']} ms, {run['ok']}/{run['sent']} ok"
            )
    print(
        f"agentic request with 1 round, over a plain chat: "
        f"{report['agent_1_minus_plain_ms_cpu_per_request']:+.3f} ms CPU per request; "
        f"each further round: {report['ms_cpu_per_round']:.3f} ms CPU"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
