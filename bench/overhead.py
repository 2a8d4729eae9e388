"""``make bench-overhead``: the gateway's added latency and cost under open-loop load.

Run: ``.venv/bin/python -m bench.overhead [--rates 200,500,1000] [--duration 10]``.

The published comparison (``docs/performance.md``), measured the way
TensorZero and Bifrost publish theirs: a fast mock (the protocol
simulator) answers at once, requests arrive on a fixed schedule
(:mod:`bench.openloop`: Poisson arrivals at each rate, every other request
streamed -- 16 chunks -- the others a plain JSON answer), and each target
is measured for ``--duration`` seconds after a warm-up at the same rate:

- ``direct``: the simulator itself (the baseline);
- ``gateway``: ``mistralrs-gateway serve`` in front of it, deployed as in
  ``bench.run`` (JWT auth alternating RS256/HS256, a tenant policy with
  limits and admission, receipts fsynced, metrics, access log);
- ``nginx``: a plain nginx reverse proxy (``bench.procs.Nginx``), when an
  ``nginx`` binary is there;
- ``litellm``: the LiteLLM proxy (optional, never a test dependency), when
  ``bench/.litellm/bin/litellm`` exists (``make bench-overhead`` tries to
  install it there; ``--no-litellm`` skips it).

Placement: the proxy under test alone on one CPU (the last one: ``taskset
-c 1`` on a 2-CPU machine), the simulator and this load generator together
on the other(s). Added latency is the target's latency percentile minus
the direct run's at the same rate (latency from the scheduled start to the
last byte; TTFT to the first content event). CPU per request is the proxy
process's utime+stime over the measured window (the gateway's receipts on
disk before it closes) divided by the requests answered; peak RSS its
``VmHWM``, reset before the window. Every loop is bounded (the schedule,
each request's timeout, the run's budget); the children are stopped by PID
in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.openloop import OpenLoopResult, Request, arrivals, run_open_loop
from bench.procs import (
    Child,
    Nginx,
    free_port,
    gateway_command,
    nginx_binary,
    nginx_version,
    pct,
    start_simulator,
    wait_ready,
)
from bench.run import ALIAS, _config, _lines, _settle, _tokens
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE, new_dev_secret
from gateway.testing.simulator.server import loop_factory
from tests.support.poll import eventually

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "overhead.json"
LITELLM = ROOT / "bench" / ".litellm" / "bin" / "litellm"
LITELLM_KEY = "sk-bench-overhead"
CHUNKS = 16
#: a chat chunk's or a chat answer's first text, compact or with json.dumps' spaces
CONTENT = re.compile(rb'"content": ?"[^"]')
STREAM_END = b"data: [DONE]\n\n"
JSON_END = b"}"
PATH = "/v1/chat/completions"

LITELLM_CONFIG = """\
model_list:
  - model_name: {alias}
    litellm_params:
      model: openai/{route}
      api_base: http://127.0.0.1:{port}/v1
      api_key: none
general_settings:
  master_key: {key}
litellm_settings:
  telemetry: false
"""


# ----------------------------------------------------------------- requests


def _post(port: int, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", f"host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def _chat(model: str, stream: bool) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "stream": stream,
            "max_tokens": 128,
            "messages": [{"role": "user", "content": f"bench [[sim chunks={CHUNKS}]]"}],
        }
    )


def requests_for(port: int, model: str, credentials: list[str]) -> Callable[[int], Request]:
    """Request ``i``: streamed when ``i`` is even (50 %), a JSON answer otherwise;
    the credentials (if any) in turn."""
    variants: list[list[Request]] = []
    for stream in (True, False):
        body = _chat(model, stream)
        tail = STREAM_END if stream else JSON_END
        auth = [{"authorization": f"Bearer {c}"} for c in credentials] or [{}]
        variants.append([Request(_post(port, body, h), CONTENT, tail, stream) for h in auth])
    streamed, plain = variants

    def pick(index: int) -> Request:
        group = streamed if index % 2 == 0 else plain
        return group[(index // 2) % len(group)]

    return pick


# ------------------------------------------------------------------ figures


def _ms(values: list[float], q: float) -> float | None:
    return round(pct(values, q) * 1000, 3) if values else None


def figures(result: OpenLoopResult, cpu_s: float, rss_mb: float | None) -> dict[str, Any]:
    ok = result.ok
    latency = [s.latency_s for s in ok if s.latency_s is not None]
    ttft = [s.ttft_s for s in ok if s.streamed and s.ttft_s is not None]
    lag = [s.start_lag_s for s in ok]
    sent = sum(1 for s in result.samples if s.result.sent)
    return {
        "rate": result.rate,
        "sent": sent,
        "ok": len(ok),
        "errors": len(result.samples) - len(ok),
        "error_kinds": result.errors(),
        "achieved_rps": round(len(ok) / result.wall_s, 1) if result.wall_s else 0.0,
        "latency_p50_ms": _ms(latency, 0.5),
        "latency_p95_ms": _ms(latency, 0.95),
        "latency_p99_ms": _ms(latency, 0.99),
        "ttft_p50_ms": _ms(ttft, 0.5),
        "ttft_p99_ms": _ms(ttft, 0.99),
        "start_lag_p99_ms": _ms(lag, 0.99),
        "cpu_ms_per_request": round(cpu_s * 1000 / len(ok), 4) if ok else None,
        "peak_rss_mb": rss_mb,
        "connections": result.connections,
    }


ADDED = (
    ("latency_p50_ms", "added_p50_ms"),
    ("latency_p95_ms", "added_p95_ms"),
    ("latency_p99_ms", "added_p99_ms"),
    ("ttft_p50_ms", "added_ttft_p50_ms"),
    ("ttft_p99_ms", "added_ttft_p99_ms"),
)


def added(direct: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """The target's percentiles minus the direct run's at the same rate."""
    out: dict[str, float | None] = {}
    for key, name in ADDED:
        d, o = direct.get(key), other.get(key)
        out[name] = round(o - d, 3) if d is not None and o is not None else None
    return out


# -------------------------------------------------------------------- runs


def _measure(
    server: Child,
    port: int,
    request_for: Callable[[int], Request],
    rate: float,
    duration_s: float,
    warmup_s: float,
    receipts: Path | None,
    timeout_s: float,
) -> dict[str, Any]:
    runner = asyncio.Runner(loop_factory=loop_factory())

    def load(seconds: float, seed: int) -> OpenLoopResult:
        schedule = arrivals(rate, seconds, seed=seed)
        return runner.run(
            run_open_loop(
                port,
                request_for,
                schedule,
                rate=rate,
                duration_s=seconds,
                request_timeout_s=timeout_s,
                budget_s=seconds + timeout_s,
            )
        )

    with runner:
        written = _lines(receipts)
        warm = load(warmup_s, seed=1)
        written = _settle(receipts, written + sum(1 for s in warm.samples if s.result.sent))
        reset = server.reset_peak_rss()
        before = server.cpu_s()
        measured = load(duration_s, seed=2)
        _settle(receipts, written + sum(1 for s in measured.samples if s.result.sent))
        cpu = server.cpu_s() - before
    rss = round(server.status_kb("VmHWM") / 1024, 1) if reset else None
    return figures(measured, cpu, rss)


def _start_litellm(
    workdir: Path, sim_port: int, env: dict[str, str], cpus: set[int] | None
) -> Child:
    """The LiteLLM proxy (one worker) in front of the simulator, serving on return."""
    port = free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        LITELLM_CONFIG.format(alias=ALIAS, route=SIM_ROUTE, port=sim_port, key=LITELLM_KEY)
    )
    # No network: its model-cost map from the package, no telemetry.
    env = {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    argv = [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    child = Child("litellm", [*argv, "--num_workers", "1"], workdir, env, cpus=cpus)
    child.port = port

    def alive() -> bool:
        if child.proc.poll() is not None:
            return True  # exited: stop polling, fail below
        try:
            url = f"http://127.0.0.1:{port}/health/liveliness"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    if not eventually(alive, 120) or child.proc.poll() is not None:
        tail = child.stderr_path.read_bytes()[-2000:].decode(errors="replace")
        child.stop()
        raise RuntimeError(f"litellm did not start:\n{tail}")
    return child


def _cpus() -> tuple[set[int] | None, set[int] | None]:
    """(the proxy's CPU, the simulator's and load generator's); None, None on one CPU."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None, None
    if len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def run(
    rates: list[float],
    duration_s: float,
    warmup_s: float,
    out: Path,
    *,
    nginx: bool = True,
    litellm: bool = True,
    litellm_max_rate: float = 200.0,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    proxy_cpus, rest = _cpus()
    before_affinity = os.sched_getaffinity(0)
    children: list[Child] = []
    notes: list[str] = []
    started = time.monotonic()
    nginx_bin = nginx_binary() if nginx else None
    if nginx and nginx_bin is None:
        notes.append("nginx: no nginx binary (PATH, /usr/sbin/nginx); its column is skipped")
    if litellm and not LITELLM.exists():
        where = LITELLM.relative_to(ROOT)
        notes.append(f"litellm: {where} is not installed; its column is skipped")
        litellm = False
    results: dict[str, dict[str, Any]] = {}
    try:
        if rest is not None:
            os.sched_setaffinity(0, rest)
        sim = start_simulator(workdir, env, rest)
        children.append(sim)
        config = _config(workdir, sim.port, 4096)
        gw = Child(
            "gateway",
            [*gateway_command(), "serve", "--config", str(config), "--port", "0"],
            workdir,
            env,
            cpus=proxy_cpus,
        )
        children.append(gw)
        gw.wait_listening()
        wait_ready(gw.port)
        targets: list[tuple[str, Child, Callable[[int], Request], Path | None]] = [
            ("direct", sim, requests_for(sim.port, SIM_ROUTE, []), None),
            ("gateway", gw, requests_for(gw.port, ALIAS, _tokens(secret)),
             workdir / "var" / "receipts.jsonl"),
        ]  # fmt: skip
        if nginx_bin is not None:
            proxy = Nginx(nginx_bin, workdir, sim.port, env, cpus=proxy_cpus)
            children.append(proxy)
            proxy.wait_serving()
            targets.append(("nginx", proxy, requests_for(proxy.port, SIM_ROUTE, []), None))
        if litellm:
            try:
                ll = _start_litellm(workdir, sim.port, env, proxy_cpus)
            except RuntimeError as exc:
                notes.append(f"litellm: did not start ({str(exc).splitlines()[0]})")
            else:
                children.append(ll)
                targets.append(("litellm", ll, requests_for(ll.port, ALIAS, [LITELLM_KEY]), None))
        for rate in rates:
            entry: dict[str, Any] = {}
            for name, server, request_for, receipts in targets:
                if name == "litellm" and rate > litellm_max_rate:
                    continue
                entry[name] = _measure(
                    server, server.port, request_for, rate, duration_s, warmup_s, receipts,
                    timeout_s,
                )  # fmt: skip
            for name, figs in entry.items():
                if name != "direct":
                    figs.update(added(entry["direct"], figs))
            results[f"{rate:g}"] = entry
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        os.sched_setaffinity(0, before_affinity)
    report: dict[str, Any] = {
        "version": 1,
        "cpus": os.cpu_count(),
        "placement": {
            "proxy": sorted(proxy_cpus) if proxy_cpus else None,
            "simulator and load generator": sorted(rest) if rest else None,
        },
        "python": sys.version.split()[0],
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "mix": f"50 % streamed ({CHUNKS} chunks), 50 % JSON; Poisson arrivals",
        "elapsed_s": round(time.monotonic() - started, 1),
        "notes": notes,
        "rates": results,
    }
    if nginx_bin is not None:
        report["nginx"] = nginx_version(nginx_bin)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


# ------------------------------------------------------------------ report


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


COLUMNS = (
    ("rate", "rate/s"),
    ("target", "target"),
    ("ok", "ok/sent"),
    ("achieved_rps", "req/s"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p99_ms", "p99 ms"),
    ("added_p50_ms", "+p50 ms"),
    ("added_p95_ms", "+p95 ms"),
    ("added_p99_ms", "+p99 ms"),
    ("added_ttft_p50_ms", "+TTFT p50"),
    ("cpu_ms_per_request", "CPU ms/req"),
    ("peak_rss_mb", "RSS MB"),
    ("start_lag_p99_ms", "lag p99 ms"),
)


def table(report: dict[str, Any]) -> str:
    rows = [tuple(label for _, label in COLUMNS)]
    for rate, entry in report["rates"].items():
        for target, figs in entry.items():
            cells = []
            for key, _ in COLUMNS:
                if key == "rate":
                    cells.append(rate)
                elif key == "target":
                    cells.append(target)
                elif key == "ok":
                    cells.append(f"{figs['ok']}/{figs['sent']}")
                else:
                    cells.append(_fmt(figs.get(key)))
            rows.append(tuple(cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "(+ = minus direct at the same rate; latency from the scheduled start; CPU and RSS:"
        " the proxy process, direct: the simulator)"
    )
    lines += report["notes"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--rates", default="50,200,500,1000", help="requests/s, comma-separated")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per rate")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-nginx", action="store_true")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument(
        "--litellm-max-rate", type=float, default=200.0, help="LiteLLM only up to this rate"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, s")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    report = run(
        rates,
        args.duration,
        args.warmup,
        args.out,
        nginx=not args.no_nginx,
        litellm=not args.no_litellm,
        litellm_max_rate=args.litellm_max_rate,
        timeout_s=args.timeout,
    )
    print(table(report))
    print(f"\nJSON written to {args.out}")
    # LiteLLM past what one CPU serves times out: its figures say so; the
    # others must answer every request.
    errors = sum(
        f["errors"] for e in report["rates"].values() for n, f in e.items() if n != "litellm"
    )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
