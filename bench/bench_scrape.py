"""Chat latency while ``/metrics`` is scraped in a loop (spec §21 finding).

Run: ``.venv/bin/python -m bench.bench_scrape [--quick] [-n 300] [--rounds 3]
[--scrapers 40] [--out PATH]``

One run starts, on 127.0.0.1, the protocol simulator and one
``mistralrs-gateway serve`` per metrics placement: ``main`` (``/metrics`` on
the callers' listener, the default) and ``listen`` (``metrics.listen``, its
own plain-HTTP port). For each, rounds alternate **idle** (chat alone) and
**flood** (the same chat load while ``--scrapers`` clients scrape the
metrics path back to back: a child process of raw asyncio connections, each
sending the next scrape as soon as the last answer is read; kept alive on
the main listener, one connection per scrape on the separate one, which
closes after each answer). The chat load is streamed chat completions
(16 chunks) at concurrency 1 on one kept-alive connection, after a warm-up.
Figures per placement and phase: chat TTFT and stream p50/p99 (request
written → first content event / ``data: [DONE]``), the gateway process's
CPU seconds over the measured requests, and the scrapes answered per second.
Target: flood stream p50 within 1.5x of idle. Placement as in ``bench.run``:
the gateway on the first CPU, simulator, scrapers and this client on the
others. Bounded: every loop is bounded in count and time; children are
stopped by PID in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from bench.loadgen import close_connections, http_post, open_connections, run_load
from bench.procs import Child, gateway_command, pct, split_cpus, start_simulator, wait_ready
from gateway.auth.authenticator import mint_dev_token
from gateway.config.loader import load_config
from gateway.testing.harness import DEMO_SECRET_ENV, default_policy, new_dev_secret, write_config
from gateway.testing.simulator.server import loop_factory

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "scrape.json"
TENANT = "acme"
ISSUER = "https://dev.gateway.local"
CHUNKS = 16
TARGET_RATIO = 1.5
#: the scrapers' credential (scope ``metrics``) for the callers' port, in their
#: environment (never on a command line): spec §24
TOKEN_ENV = "BENCH_SCRAPE_TOKEN"
#: a scraper's own bounds: one answer, and the whole flood
_SCRAPE_TIMEOUT_S = 10.0
_MAX_ANSWER = 64 << 20


# ------------------------------------------------------------------ scrapers


async def _scrape_once(
    port: int,
    path: str,
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    auth: str = "",
) -> tuple[int, tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]:
    """One ``GET path`` (``auth``: an authorization header line, or ""); (body
    bytes, the connection if it stays open)."""
    if conn is None:
        conn = await asyncio.open_connection("127.0.0.1", port)
    reader, writer = conn
    request = f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{auth}\r\n"
    writer.write(request.encode("ascii"))
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode("latin-1"))
    fields = {
        name.strip().lower(): value.strip().lower()
        for name, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if b"content-length" in fields:
        length = int(fields[b"content-length"])
        if length > _MAX_ANSWER:
            raise RuntimeError("answer too large")
        await reader.readexactly(length)
    else:  # chunked (an ASGI answer without a length)
        length = 0
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            length += size
            if length > _MAX_ANSWER:
                raise RuntimeError("answer too large")
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")  # no trailers here: the blank line
    closing = fields.get(b"connection") == b"close"
    if closing:
        writer.close()
        return length, None
    return length, conn


async def _scrapers(
    port: int, path: str, clients: int, seconds: float, loops: int
) -> dict[str, Any]:
    stop_at = time.monotonic() + seconds
    stopped = asyncio.Event()
    # SIGTERM (the bench, once its chat load is measured) ends the flood; the report follows.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    counts = [0] * clients
    errors: dict[str, int] = {}
    last_size = 0
    token = os.environ.get(TOKEN_ENV)
    auth = f"authorization: Bearer {token}\r\n" if token else ""

    async def client(slot: int) -> None:
        nonlocal last_size
        conn = None
        while counts[slot] < loops and time.monotonic() < stop_at and not stopped.is_set():
            try:
                size, conn = await asyncio.wait_for(
                    _scrape_once(port, path, conn, auth), _SCRAPE_TIMEOUT_S
                )
            except (OSError, TimeoutError, RuntimeError, asyncio.IncompleteReadError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                if conn is not None:
                    conn[1].close()
                conn = None
                await asyncio.sleep(0.01)
                continue
            counts[slot] += 1
            last_size = size
        if conn is not None:
            conn[1].close()

    started = time.monotonic()
    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    sys.stdout.write("scraping\n")  # the handler is in place: the bench may start its load
    sys.stdout.flush()
    await asyncio.gather(*tasks)
    return {
        "scrapes": sum(counts),
        "elapsed_s": round(time.monotonic() - started, 3),
        "exposition_bytes": last_size,
        "errors": errors,
    }


def scraper_main(argv: list[str]) -> int:
    """The flood's child process: ``--scraper PORT PATH CLIENTS SECONDS LOOPS``."""
    port, path, clients, seconds, loops = argv
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        report = runner.run(_scrapers(int(port), path, int(clients), float(seconds), int(loops)))
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    return 0


# ------------------------------------------------------------------ chat load


class Target:
    """One gateway child: its chat request and the port its metrics answer on."""

    def __init__(self, name: str, child: Child, metrics_port: int, token: str) -> None:
        self.name = name
        self.child = child
        self.metrics_port = metrics_port
        self.token = token
        body = orjson.dumps(
            {
                "model": "gemma-4-mm",
                "stream": True,
                "max_tokens": 128,
                "messages": [{"role": "user", "content": f"bench [[sim chunks={CHUNKS}]]"}],
            }
        )
        self.request = http_post(
            child.port, "/v1/chat/completions", body, {"authorization": f"Bearer {token}"}
        )
        self.phases: dict[str, dict[str, Any]] = {
            phase: {
                "ttft": [],
                "stream": [],
                "cpu_s": 0.0,
                "ok": 0,
                "errors": {},
                "scrapes": 0,
                "scrape_s": 0.0,
                "scrape_errors": {},
                "exposition_bytes": 0,
            }
            for phase in ("idle", "flood")
        }


def _chat(runner: asyncio.Runner, target: Target, total: int, warm: int, phase: str) -> None:
    conns = runner.run(open_connections(target.child.port, 1))
    try:
        runner.run(
            run_load(
                target.child.port,
                lambda _i: target.request,
                total=warm,
                concurrency=1,
                request_timeout_s=10,
                budget_s=60,
                connections=conns,
            )
        )
        before = target.child.cpu_s()
        measured = runner.run(
            run_load(
                target.child.port,
                lambda _i: target.request,
                total=total,
                concurrency=1,
                request_timeout_s=10,
                budget_s=120,
                connections=conns,
            )
        )
        cpu = target.child.cpu_s() - before
    finally:
        close_connections(conns)
    figures = target.phases[phase]
    figures["cpu_s"] += cpu
    figures["ok"] += len(measured.ok)
    figures["ttft"] += [r.ttft_s for r in measured.ok if r.ttft_s is not None]
    figures["stream"] += [r.duration_s for r in measured.ok]
    for kind, count in measured.errors().items():
        figures["errors"][kind] = figures["errors"].get(kind, 0) + count


def _flood(
    runner: asyncio.Runner,
    target: Target,
    workdir: Path,
    env: dict[str, str],
    cpus: set[int] | None,
    args: argparse.Namespace,
    round_no: int,
) -> None:
    argv = [
        sys.executable,
        "-m",
        "bench.bench_scrape",
        "--scraper",
        str(target.metrics_port),
        "/metrics",
        str(args.scrapers),
        str(args.flood_s),
        str(args.max_loops),
    ]
    # bench/ is not installed: the child imports it from the checkout
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    if target.name == "main":
        env[TOKEN_ENV] = target.token  # /metrics on the callers' port needs scope metrics
    scraper = Child(f"scrapers-{target.name}-{round_no}", argv, workdir, env, cpus=cpus)
    try:
        deadline = time.monotonic() + 30
        while b"scraping" not in scraper.stdout_path.read_bytes():
            if time.monotonic() > deadline or scraper.proc.poll() is not None:
                raise RuntimeError(scraper.stderr_path.read_text()[-2000:] or "scrapers failed")
            time.sleep(0.02)
        time.sleep(0.3)  # every scraper has sent its first scrape
        _chat(runner, target, args.n, args.warm, "flood")
    finally:
        scraper.stop(timeout_s=_SCRAPE_TIMEOUT_S + 5)  # SIGTERM: the scrapers report and exit
    lines = scraper.stdout_path.read_bytes().splitlines()
    figures = target.phases["flood"]
    if len(lines) > 1:
        report = orjson.loads(lines[-1])
        figures["scrapes"] += report["scrapes"]
        figures["scrape_s"] += report["elapsed_s"]
        figures["exposition_bytes"] = report["exposition_bytes"]
        for kind, count in report["errors"].items():
            figures["scrape_errors"][kind] = figures["scrape_errors"].get(kind, 0) + count
    else:
        figures["scrape_errors"]["no report"] = figures["scrape_errors"].get("no report", 0) + 1
        tail = scraper.stderr_path.read_text(errors="replace")[-2000:]
        print(
            f"scrapers exited {scraper.proc.returncode} without a report:\n{tail}", file=sys.stderr
        )


def _figures(phase: dict[str, Any]) -> dict[str, Any]:
    ttft, stream = phase["ttft"], phase["stream"]

    def ms(values: list[float], q: float) -> float | None:
        return round(pct(values, q) * 1000, 3) if values else None

    return {
        "ok": phase["ok"],
        "errors": phase["errors"],
        "ttft_p50_ms": ms(ttft, 0.5),
        "ttft_p99_ms": ms(ttft, 0.99),
        "stream_p50_ms": ms(stream, 0.5),
        "stream_p99_ms": ms(stream, 0.99),
        "cpu_s_per_1000": round(phase["cpu_s"] * 1000 / phase["ok"], 4) if phase["ok"] else None,
        "scrapes_per_s": round(phase["scrapes"] / phase["scrape_s"], 1) if phase["scrape_s"] else 0,
        "scrape_errors": phase["scrape_errors"],
        "exposition_bytes": phase["exposition_bytes"],
    }


@contextmanager
def _children() -> Iterator[list[Child]]:
    children: list[Child] = []
    try:
        yield children
    finally:
        for child in reversed(children):
            child.stop()


def _config(workdir: Path, sim_port: int, placement: str) -> Path:
    policy = default_policy(
        TENANT,
        limits={"max_output_tokens": 512, "requests_per_minute": 10_000_000},
        admission={"share": 1, "max_permits": 8, "queue_timeout_s": 10},
    )
    metrics: dict[str, Any] = {"path": "/metrics"}
    if placement == "listen":
        metrics["listen"] = {"host": "127.0.0.1", "port": 0}
    return write_config(
        workdir,
        upstream_port=sim_port,
        policies={TENANT: policy},
        upstream={"readiness_poll_s": 2, "readiness_timeout_s": 2},  # the deployed defaults
        metrics=metrics,
    )


def _metrics_port(child: Child, placement: str, timeout_s: float = 20) -> int:
    if placement == "main":
        return child.port
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for raw in (child.stdout_path.read_bytes(), child.stderr_path.read_bytes()):
            marker = b"metrics listening on http://127.0.0.1:"
            if marker in raw:
                return int(raw.split(marker, 1)[1].split(b"/", 1)[0])
        time.sleep(0.05)
    raise RuntimeError("the metrics listener's port never showed in the gateway's log")


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-scrape-"))
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    gateway_cpus, other_cpus = split_cpus()
    before_affinity = os.sched_getaffinity(0)
    started = time.monotonic()
    targets: list[Target] = []
    try:
        if other_cpus is not None:
            os.sched_setaffinity(0, other_cpus)  # this client, and the children it forks
        with _children() as children:
            sim = start_simulator(workdir, env, other_cpus)
            children.append(sim)
            for placement in args.placements:
                config = _config(workdir / placement, sim.port, placement)
                child = Child(
                    f"gateway-{placement}",
                    [*gateway_command(), "serve", "--config", str(config), "--port", "0"],
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
                    scopes=["inference", "metrics"],
                    ttl_s=3600,
                    issuer=ISSUER,
                    env={DEMO_SECRET_ENV: secret},
                )
                targets.append(Target(placement, child, _metrics_port(child, placement), token))
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                for round_no in range(args.rounds):
                    for target in targets:  # alternate: both phases see the same machine
                        _chat(runner, target, args.n, args.warm, "idle")
                        _flood(runner, target, workdir, env, other_cpus, args, round_no)
    finally:
        if other_cpus is not None:
            os.sched_setaffinity(0, before_affinity)
        shutil.rmtree(workdir, ignore_errors=True)
    report: dict[str, Any] = {
        "version": 1,
        "params": {
            "requests_per_phase_and_round": args.n,
            "rounds": args.rounds,
            "scrapers": args.scrapers,
            "chunks": CHUNKS,
            "concurrency": 1,
        },
        "cpus": os.cpu_count(),
        "placement": None
        if gateway_cpus is None or other_cpus is None
        else {"gateway": sorted(gateway_cpus), "simulator, scrapers, client": sorted(other_cpus)},
        "python": sys.version.split()[0],
        "elapsed_s": round(time.monotonic() - started, 1),
        "metrics": {},
        "targets": [],
    }
    for target in targets:
        idle, flood = _figures(target.phases["idle"]), _figures(target.phases["flood"])
        report["metrics"][target.name] = {"idle": idle, "flood": flood}
        if idle["stream_p50_ms"] and flood["stream_p50_ms"]:
            ratio = round(flood["stream_p50_ms"] / idle["stream_p50_ms"], 3)
            report["targets"].append(
                {
                    "target": f"{target.name}: chat stream p50, flood / idle",
                    "value": ratio,
                    "limit": TARGET_RATIO,
                    "met": ratio <= TARGET_RATIO,
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


def table(report: dict[str, Any]) -> str:
    rows = [("metrics on", "figure", "idle", "flood", "flood / idle")]
    for name, phases in report["metrics"].items():
        idle, flood = phases["idle"], phases["flood"]
        first = True
        for key, label in (
            ("ok", "chat ok"),
            ("ttft_p50_ms", "TTFT p50 ms"),
            ("ttft_p99_ms", "TTFT p99 ms"),
            ("stream_p50_ms", "stream p50 ms"),
            ("stream_p99_ms", "stream p99 ms"),
            ("cpu_s_per_1000", "gateway CPU s/1000 chat"),
            ("scrapes_per_s", "scrapes answered /s"),
        ):
            a, b = idle[key], flood[key]
            ratio = f"{b / a:.2f}" if a and b and key not in ("ok", "scrapes_per_s") else ""
            rows.append((name if first else "", label, str(a), str(b), ratio))
            first = False
        rows.append(("", "exposition bytes", "", str(flood["exposition_bytes"]), ""))
        errors = {**idle["errors"], **flood["errors"], **flood["scrape_errors"]}
        rows.append(("", "errors", "", str(errors or 0), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for t in report["targets"]:
        mark = "ok  " if t["met"] else "MISS"
        lines.append(f"[{mark}] {t['target']}: {t['value']:.3f} (limit {t['limit']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--scraper"]:
        return scraper_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.bench_scrape", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    parser.add_argument("-n", type=int, default=300, help="measured chat requests per phase")
    parser.add_argument("--warm", type=int, default=30, help="unmeasured chat requests first")
    parser.add_argument("--rounds", type=int, default=3, help="idle/flood rounds per placement")
    parser.add_argument("--scrapers", type=int, default=40, help="concurrent scrape clients")
    parser.add_argument(
        "--max-loops", type=int, default=100_000, help="scrapes per client, at most"
    )
    parser.add_argument(
        "--placement",
        dest="placements",
        action="append",
        choices=("main", "listen"),
        help="where /metrics is served (default: both)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args(argv)
    args.placements = args.placements or ["main", "listen"]
    if args.quick:
        args.n, args.warm, args.rounds, args.scrapers = 30, 5, 1, 4
    # an upper bound: the bench stops the flood once its chat load is measured
    args.flood_s = 60.0 + args.n * 0.1
    report = run(args)
    print(table(report))
    print(f"\nJSON written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
