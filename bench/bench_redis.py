"""What the shared limits store costs a request: the gateway on Redis vs on memory.

Run: ``.venv/bin/python -m bench.bench_redis [--quick] [-n 500] [--rounds 6] [--out PATH]``

One run starts, on 127.0.0.1, the protocol simulator, a throwaway
``redis-server`` (no persistence) and two ``mistralrs-gateway serve``
processes that differ only in ``limits_store.backend`` (``memory`` and
``redis``), with one tenant whose four shared limits are all set (never
reached), so every request takes the whole reserve and settle path. The
rounds alternate the two gateways (memory, redis, memory, redis, ...) over
the same kept-alive connection at concurrency 1, so both see the same
machine state. Per store: TTFT p50/p99 (request written → first content
event), stream p50, and the gateway process's CPU seconds per 1000
requests (``/proc/<pid>/stat`` over each measured round, after its receipts
are written). Then the store's own ``reserve`` latency, measured in this
process against the same Redis (as ``bench_limits`` does). Placement as in
``bench.run``: the gateways on the first CPU, simulator, Redis and this
client on the others. Targets: Redis adds at most 0.3 ms to TTFT p50 and
0.3 s of gateway CPU per 1000 requests. Bounded: every loop is bounded in
count and time; children are stopped by PID in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.bench_limits import reserve_timings
from bench.loadgen import LoadResult, close_connections, http_post, open_connections, run_load
from bench.procs import Child, gateway_command, pct, split_cpus, start_simulator, wait_ready
from gateway.auth.authenticator import mint_dev_token
from gateway.config.loader import load_config
from gateway.ratelimit import LimitsStore, MemoryLimitsStore, RedisLimitsStore, TenantLimits
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    default_policy,
    new_dev_secret,
    write_config,
)
from gateway.testing.simulator.server import loop_factory
from tests.support.poll import eventually

RESULTS = Path(__file__).resolve().parent / "results" / "redis.json"
TENANT = "acme"
ISSUER = "https://dev.gateway.local"
#: all four limits set and never reached: every request takes the full path
LIMITS = {
    "requests_per_minute": 10_000_000,
    "tokens_per_minute": 1_000_000_000,
    "tokens_per_day": 1_000_000_000_000,
    "max_concurrent_requests": 10_000,
}
STORE_LIMITS = TenantLimits(*LIMITS.values())
TARGETS = {"ttft_p50_ms": 0.3, "cpu_s_per_1000": 0.3}
CHUNKS = 16


def _config(workdir: Path, sim_port: int, store: dict[str, Any]) -> Path:
    policy = default_policy(
        TENANT,
        limits={"max_output_tokens": 512, **LIMITS},
        admission={"share": 1, "max_permits": 8, "queue_timeout_s": 10},
    )
    return write_config(
        workdir,
        upstream_port=sim_port,
        policies={TENANT: policy},
        upstream={"readiness_poll_s": 2, "readiness_timeout_s": 2},  # the deployed defaults
        limits_store=store,
    )


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


class Target:
    """One gateway child with its payload and audit file."""

    def __init__(self, name: str, child: Child, config: Path, token: str) -> None:
        self.name = name
        self.child = child
        self.receipts = load_config(config).audit.path
        self.token = token
        body = orjson.dumps(
            {
                "model": "gemma-4-mm",
                "stream": True,
                "max_tokens": 128,
                "messages": [{"role": "user", "content": f"bench [[sim chunks={CHUNKS}]]"}],
            }
        )
        headers = {"authorization": f"Bearer {token}"}
        self.request = http_post(child.port, "/v1/chat/completions", body, headers)
        self.ttft: list[float] = []
        self.stream: list[float] = []
        self.cpu_s = 0.0
        self.ok = 0
        #: (TTFT p50 ms, CPU s per 1000) of each round
        self.per_round: list[tuple[float, float]] = []
        self.errors: dict[str, int] = {}

    def payload(self) -> Callable[[int], bytes]:
        return lambda _i: self.request


def _round(run: asyncio.Runner, target: Target, total: int, warm: int) -> None:
    """Warm up, then measure ``total`` requests at concurrency 1 on one connection."""
    conns = run.run(open_connections(target.child.port, 1))

    def load(count: int) -> LoadResult:
        return run.run(
            run_load(
                target.child.port,
                target.payload(),
                total=count,
                concurrency=1,
                request_timeout_s=10,
                budget_s=120,
                connections=conns,
            )
        )

    try:
        written = _lines(target.receipts)
        load(warm)
        eventually(lambda: _lines(target.receipts) >= written + warm, 10)
        written = _lines(target.receipts)
        before = target.child.cpu_s()
        measured = load(total)
        sent = sum(1 for r in measured.results if r.sent)
        # the round's work ends with its receipts on disk
        eventually(lambda: _lines(target.receipts) >= written + sent, 10)
        cpu = target.child.cpu_s() - before
        target.cpu_s += cpu
    finally:
        close_connections(conns)
    ok = measured.ok
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    if ttfts:
        target.per_round.append((pct(ttfts, 0.5) * 1000, cpu * 1000 / max(1, len(ok))))
    target.ok += len(ok)
    target.ttft += [r.ttft_s for r in ok if r.ttft_s is not None]
    target.stream += [r.duration_s for r in ok]
    for kind, count in measured.errors().items():
        target.errors[kind] = target.errors.get(kind, 0) + count


def _figures(target: Target) -> dict[str, Any]:
    per_k = 1000 / target.ok if target.ok else 0.0
    return {
        "ok": target.ok,
        "errors": target.errors,
        "ttft_p50_ms": round(pct(target.ttft, 0.5) * 1000, 3) if target.ttft else None,
        "ttft_p99_ms": round(pct(target.ttft, 0.99) * 1000, 3) if target.ttft else None,
        "stream_p50_ms": round(pct(target.stream, 0.5) * 1000, 3) if target.stream else None,
        "cpu_s_per_1000": round(target.cpu_s * per_k, 4),
    }


async def _store_latency(url: str, n: int) -> dict[str, dict[str, float]]:
    """The stores' own reserve latency in µs (reserve timed alone; settle after it)."""
    out: dict[str, dict[str, float]] = {}
    stores: dict[str, LimitsStore] = {
        "memory": MemoryLimitsStore(),
        "redis": RedisLimitsStore.from_url(url, timeout_s=1.0, key_prefix="bench-store:"),
    }
    for name, store in stores.items():
        timings = await reserve_timings(store, n, STORE_LIMITS)
        await store.aclose(5)
        out[name] = {
            "p50_us": round(statistics.median(timings), 1),
            "p99_us": round(pct(timings, 0.99), 1),
            "max_us": round(max(timings), 1),
        }
    return out


@contextmanager
def _children() -> Iterator[list[Child]]:
    children: list[Child] = []
    try:
        yield children
    finally:
        for child in reversed(children):
            child.stop()


def run(total: int, rounds: int, warm: int, store_n: int, out: Path) -> dict[str, Any]:
    from tests.support.redis import redis_server  # test equipment: a throwaway server

    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-redis-"))
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    gateway_cpus, other_cpus = split_cpus()
    before_affinity = os.sched_getaffinity(0)
    started = time.monotonic()
    try:
        if other_cpus is not None:
            os.sched_setaffinity(0, other_cpus)  # this client, and the children it forks
        with redis_server() as redis, _children() as children:
            sim = start_simulator(workdir, env, other_cpus)
            children.append(sim)
            command = gateway_command()
            stores = {
                "memory": {"backend": "memory"},
                "redis": {"backend": "redis", "url": redis.url, "key_prefix": "bench-gw:"},
            }
            targets: list[Target] = []
            for name, store in stores.items():
                config = _config(workdir / name, sim.port, store)
                child = Child(
                    f"gateway-{name}",
                    [*command, "serve", "--config", str(config), "--port", "0"],
                    workdir,
                    env,
                    cpus=gateway_cpus,
                )
                children.append(child)
                child.wait_listening()
                wait_ready(child.port)
                token = mint_dev_token(
                    load_config(config).auth,
                    TENANT,
                    # metrics: the histogram below is read from the callers' port (§24)
                    scopes=["inference", "metrics"],
                    ttl_s=3600,
                    issuer=ISSUER,
                    env={DEMO_SECRET_ENV: secret},
                )
                targets.append(Target(name, child, config, token))
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                for _ in range(rounds):  # alternate: both see the same machine state
                    for target in targets:
                        _round(runner, target, total, warm)
                store_latency = runner.run(_store_latency(redis.url, store_n))
            histogram = _reserve_histogram(targets[1].child.port, targets[1].token)
    finally:
        if other_cpus is not None:
            os.sched_setaffinity(0, before_affinity)
        shutil.rmtree(workdir, ignore_errors=True)
    figures = {t.name: _figures(t) for t in targets}
    delta = {
        key: round(figures["redis"][key] - figures["memory"][key], 4)
        for key in ("ttft_p50_ms", "ttft_p99_ms", "stream_p50_ms", "cpu_s_per_1000")
    }
    # paired by round (each redis round ran right after its memory round)
    pairs = list(zip(targets[0].per_round, targets[1].per_round, strict=False))
    per_round = {
        "ttft_p50_ms": [round(r[0] - m[0], 3) for m, r in pairs],
        "cpu_s_per_1000": [round(r[1] - m[1], 3) for m, r in pairs],
    }
    report = {
        "version": 1,
        "params": {"total_per_round": total, "rounds": rounds, "concurrency": 1, "chunks": CHUNKS},
        "cpus": os.cpu_count(),
        "placement": None
        if gateway_cpus is None or other_cpus is None
        else {"gateways": sorted(gateway_cpus), "simulator, redis, client": sorted(other_cpus)},
        "python": sys.version.split()[0],
        "elapsed_s": round(time.monotonic() - started, 1),
        "gateway": figures,
        "delta_redis_minus_memory": delta,
        "delta_per_round": per_round,
        "store_reserve": store_latency,
        "gateway_reserve_histogram": histogram,
        "targets": [
            {"target": f"redis - memory: {key}", "value": delta[key], "limit": limit}
            | {"met": delta[key] <= limit}
            for key, limit in TARGETS.items()
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


def _reserve_histogram(port: int, token: str) -> dict[str, Any]:
    """The Redis gateway's own ``gateway_limits_store_seconds{op="reserve"}``:
    its count and the bucket bounds of its p50 and p99."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"authorization": f"Bearer {token}"}
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=5).text
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "gateway_limits_store_seconds_bucket"
                and sample.labels.get("op") == "reserve"
            ):
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    count = buckets[-1][1] if buckets else 0.0

    def bound(q: float) -> float | None:
        found = next((le for le, seen in buckets if seen >= q * count), None) if count else None
        return None if found is None else found * 1000

    return {"count": int(count), "p50_le_ms": bound(0.5), "p99_le_ms": bound(0.99)}


def table(report: dict[str, Any]) -> str:
    g, d = report["gateway"], report["delta_redis_minus_memory"]
    rows = [("figure", "memory", "redis", "redis - memory")]
    rows.append(("ok", str(g["memory"]["ok"]), str(g["redis"]["ok"]), ""))
    for key, label in (
        ("ttft_p50_ms", "TTFT p50 ms"),
        ("ttft_p99_ms", "TTFT p99 ms"),
        ("stream_p50_ms", "stream p50 ms"),
        ("cpu_s_per_1000", "gateway CPU s/1000 req"),
    ):
        rows.append((label, f"{g['memory'][key]:.3f}", f"{g['redis'][key]:.3f}", f"{d[key]:+.3f}"))
    s = report["store_reserve"]
    for key, label in (("p50_us", "store reserve p50 µs"), ("p99_us", "store reserve p99 µs")):
        rows.append((label, f"{s['memory'][key]:.1f}", f"{s['redis'][key]:.1f}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    h = report["gateway_reserve_histogram"]
    lines.append(
        f"(redis gateway's own gateway_limits_store_seconds{{op=reserve}}: {h['count']} calls,"
        f" p50 <= {h['p50_le_ms']} ms, p99 <= {h['p99_le_ms']} ms by bucket)"
    )
    rounds = report["delta_per_round"]
    for key, label in (("ttft_p50_ms", "TTFT p50 ms"), ("cpu_s_per_1000", "CPU s/1000")):
        values = rounds[key]
        if values:
            lines.append(
                f"per round, redis - memory, {label}: median {statistics.median(values):+.3f}"
                f" (rounds: {', '.join(f'{v:+.3f}' for v in values)})"
            )
    errors = {k: v["errors"] for k, v in g.items() if v["errors"]}
    lines.append(f"errors: {errors or 0}")
    for t in report["targets"]:
        mark = "ok  " if t["met"] else "MISS"
        lines.append(f"[{mark}] {t['target']}: {t['value']:+.3f} (limit +{t['limit']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_redis", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    parser.add_argument("-n", type=int, default=500, help="measured requests per round and store")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds per store")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    if args.quick:
        report = run(total=20, rounds=1, warm=5, store_n=200, out=args.out)
    else:
        report = run(total=args.n, rounds=args.rounds, warm=50, store_n=5000, out=args.out)
    print(table(report))
    print(f"\nJSON written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
