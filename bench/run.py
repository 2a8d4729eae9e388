"""``make bench``: the same scenarios direct to the simulator and through the gateway.

Run: ``.venv/bin/python -m bench.run [--quick] [--out PATH]``.

One run starts two child processes on 127.0.0.1 — the protocol simulator and
``mistralrs-gateway serve`` (one uvicorn worker, uvloop + httptools; RS256 and
HS256 JWT issuers, one tenant policy, admission capacity above the
concurrency, receipts and metrics on) — and drives both from this process
with the raw-asyncio client in :mod:`bench.loadgen`, so the load generator
never shares the gateway's process. Scenarios stream chat completions or,
the ``responses_*`` ones, ``/v1/responses`` (the named events; TTFT is the
first non-empty ``response.output_text.delta``). Per scenario and target it reports
requests ok/sent, req/s, TTFT p50/p99 (request sent → first content event),
stream duration p50, CPU seconds per 1000 requests of the serving process
(``/proc/<pid>/stat``: the simulator direct, the gateway through it), peak RSS
(``VmHWM``) and each figure's ratio to direct. With ``--nginx`` a third target,
a plain nginx reverse proxy on the gateway's CPU in front of the same
simulator, is measured like the gateway for reference (columns ``nginx`` and
``gw/nginx``). Every stream must end with
``[DONE]``; anything else is counted as an error. Bounded: every loop is
bounded in count and time, and the children are stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson

from bench.loadgen import (
    CHAT_CONTENT,
    DONE_TAIL,
    MESSAGES_CONTENT,
    MESSAGES_TAIL,
    RESPONSES_CONTENT,
    LoadResult,
    close_connections,
    http_post,
    open_connections,
    run_load,
)
from bench.procs import (
    Child,
    Nginx,
    gateway_command,
    nginx_binary,
    nginx_version,
    start_simulator,
    wait_ready,
)
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    SIM_ROUTE,
    default_policy,
    new_dev_secret,
    write_config,
)
from gateway.testing.samples import SAMPLES
from gateway.testing.simulator.server import loop_factory
from tests.support.poll import eventually

ROOT = Path(__file__).resolve().parents[1]
KEYS = ROOT / "fixtures" / "keys"
RESULTS = ROOT / "bench" / "results" / "latest.json"
RS_ISSUER = "https://idp.bench.local"
HS_ISSUER = "https://dev.gateway.local"
AUDIENCE = "mistralrs-gateway"
TENANT = "acme"
ALIAS = "gemma-4-mm"
MEDIA_TYPES = {"tiny.png": "image/png", "tiny.wav": "audio/wav", "tiny.mp4": "video/mp4"}
MEDIA_KIND = {"tiny.png": "image", "tiny.wav": "audio", "tiny.mp4": "video"}


@dataclass(frozen=True)
class Scenario:
    name: str
    concurrency: int
    total: int
    chunks: int
    delay_ms: float = 0.0
    multimodal: bool = False
    api: str = "chat"  # chat | responses | messages


FULL = (
    Scenario("latency", 1, 1000, 16),
    Scenario("throughput", 64, 2000, 64),
    Scenario("slow", 512, 512, 20, delay_ms=50),
    Scenario("multimodal", 8, 400, 16, multimodal=True),
    Scenario("responses_latency", 1, 1000, 16, api="responses"),
    Scenario("responses_throughput", 64, 2000, 64, api="responses"),
    Scenario("messages_latency", 1, 1000, 16, api="messages"),
    Scenario("messages_throughput", 64, 2000, 64, api="messages"),
)
QUICK = (
    Scenario("latency", 1, 20, 16),
    Scenario("throughput", 8, 40, 64),
    Scenario("slow", 32, 32, 5, delay_ms=50),
    Scenario("multimodal", 2, 10, 16, multimodal=True),
    Scenario("responses_latency", 1, 20, 16, api="responses"),
    Scenario("responses_throughput", 8, 40, 64, api="responses"),
    Scenario("messages_latency", 1, 20, 16, api="messages"),
    Scenario("messages_throughput", 8, 40, 64, api="messages"),
)
#: what each API's requests are posted to, and how its first content event looks
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
FIRST_CONTENT = {"chat": CHAT_CONTENT, "responses": RESPONSES_CONTENT, "messages": MESSAGES_CONTENT}
DONE = {"chat": DONE_TAIL, "responses": DONE_TAIL, "messages": MESSAGES_TAIL}
#: (scenario of another API, its chat counterpart): same concurrency, count and chunks
RESPONSES_VS_CHAT = (("responses_latency", "latency"), ("responses_throughput", "throughput"))
MESSAGES_VS_CHAT = (("messages_latency", "latency"), ("messages_throughput", "throughput"))
VS_CHAT = dict(RESPONSES_VS_CHAT + MESSAGES_VS_CHAT)


# ------------------------------------------------------------------ setup


def _tokens(secret: str) -> list[str]:
    now = int(time.time())
    claims = {
        "aud": AUDIENCE,
        "iat": now,
        "exp": now + 1800,
        "sub": "bench",
        "tenant": TENANT,
        "scope": "inference evidence",
    }
    rsa_key = (KEYS / "rsa1_private.pem").read_bytes()
    rs = jwt.encode({**claims, "iss": RS_ISSUER}, rsa_key, algorithm="RS256", headers={"kid": "k1"})
    hs = jwt.encode({**claims, "iss": HS_ISSUER}, secret, algorithm="HS256")
    return [rs, hs]


def _config(
    workdir: Path, sim_port: int, capacity: int, state: dict[str, Any] | None = None
) -> Path:
    policy = default_policy(
        TENANT,
        limits={
            "max_output_tokens": 512,
            "requests_per_minute": 10_000_000,
            "tokens_per_minute": 1_000_000_000,
        },
        admission={"share": 1, "max_permits": capacity, "queue_timeout_s": 10},
        endpoints=["chat.completions", "responses", "messages", "evidence", "models"],
    )
    issuers = [
        {
            "issuer": RS_ISSUER,
            "audience": AUDIENCE,
            "algorithms": ["RS256"],
            "jwks_file": str(KEYS / "jwks.json"),
        },
        {
            "issuer": HS_ISSUER,
            "audience": AUDIENCE,
            "algorithms": ["HS256"],
            "hs256_secret_env": DEMO_SECRET_ENV,
        },
    ]
    return write_config(
        workdir,
        upstream_port=sim_port,
        policies={TENANT: policy},
        issuers=issuers,
        upstream={"readiness_poll_s": 2, "readiness_timeout_s": 2},  # the deployed defaults
        admission={"capacity": capacity, "max_queue": capacity},
        staging={"dir": "var/evidence", "catalog": "var/catalog.sqlite3"},
        audit={"path": "var/receipts.jsonl"},
        metrics={"path": "/metrics"},
        state=state or {"backend": "sqlite"},
    )


def _upload_samples(port: int, token: str) -> list[tuple[str, str]]:
    """Stage the three samples; return (kind, evidence id) in order."""
    staged = []
    for name, build in SAMPLES.items():
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/evidence",
            content=build(),
            headers={"authorization": f"Bearer {token}", "content-type": MEDIA_TYPES[name]},
            timeout=10,
        )
        if response.status_code != 201:
            raise RuntimeError(f"evidence upload failed: {response.status_code}")
        staged.append((MEDIA_KIND[name], response.json()["id"]))
    return staged


# --------------------------------------------------------------- requests


def _body(model: str, text: str, media: list[tuple[str, str]], api: str) -> bytes:
    if api == "messages":
        return orjson.dumps(
            {
                "model": model,
                "stream": True,
                "max_tokens": 128,
                "messages": [{"role": "user", "content": text}],
            }
        )
    if api == "responses":
        return orjson.dumps(
            {"model": model, "stream": True, "max_output_tokens": 128, "input": text}
        )
    content: Any = text
    if media:
        parts: list[dict[str, Any]] = [
            {"type": f"{kind}_url", f"{kind}_url": {"url": url}} for kind, url in media
        ]
        content = [*parts, {"type": "text", "text": text}]
    return orjson.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": 128,
            "messages": [{"role": "user", "content": content}],
        }
    )


def _payloads(
    port: int,
    gateway: bool,
    directive: str,
    tokens: list[str],
    media: list[tuple[str, str]],
    api: str,
) -> Callable[[int], bytes]:
    text = f"bench {directive}"
    model = ALIAS if gateway else SIM_ROUTE
    body = _body(model, text, media, api)
    path = PATHS[api]
    if not gateway:
        request = http_post(port, path, body, {})
        return lambda _i: request
    # Alternate the RS256 and HS256 credentials.
    requests = [http_post(port, path, body, {"authorization": f"Bearer {t}"}) for t in tokens]
    return lambda i: requests[i % len(requests)]


def _direct_media() -> list[tuple[str, str]]:
    """What the gateway forwards in data-URL mode, for the direct baseline."""
    out = []
    for name, build in SAMPLES.items():
        encoded = base64.b64encode(build()).decode("ascii")
        out.append((MEDIA_KIND[name], f"data:{MEDIA_TYPES[name]};base64,{encoded}"))
    return out


# ---------------------------------------------------------------- measure


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def _figures(load: LoadResult, server: Child, sim: Child, cpu: dict[str, float]) -> dict[str, Any]:
    ok = load.ok
    sent = sum(1 for r in load.results if r.sent)
    per_k = 1000 / len(ok) if ok else 0.0
    return {
        "sent": sent,
        "ok": len(ok),
        "errors": len(load.results) - len(ok),
        "error_kinds": load.errors(),
        "wall_s": round(load.wall_s, 3),
        "rps": round(len(ok) / load.wall_s, 1) if load.wall_s else 0.0,
        "ttft_p50_ms": _ms(_pct([r.ttft_s for r in ok if r.ttft_s is not None], 0.5)),
        "ttft_p99_ms": _ms(_pct([r.ttft_s for r in ok if r.ttft_s is not None], 0.99)),
        "stream_p50_ms": _ms(_pct([r.duration_s for r in ok], 0.5)),
        "cpu_s_per_1000": round(cpu["server"] * per_k, 4),
        # of which threads other than the event loop's (receipt writer, executor)
        "threads_cpu_s_per_1000": round(cpu["server_threads"] * per_k, 4),
        "peak_rss_mb": round(server.status_kb("VmHWM") / 1024, 1),
        "sim_cpu_s_per_1000": round(cpu["sim"] * per_k, 4),
        "client_cpu_s_per_1000": round(cpu["client"] * per_k, 4),
        "serving_pid": server.pid,
    }


def _measure(
    scenario: Scenario,
    server: Child,
    sim: Child,
    payload_for: Callable[[int], bytes],
    warm_for: Callable[[int], bytes],
    budget_s: float,
    timeout_s: float,
    receipts: Path | None,
) -> dict[str, Any]:
    """One scenario against ``server``; ``receipts`` is the gateway's audit file
    (None direct): its lines show when the gateway's work for a run is done."""
    run = asyncio.Runner(loop_factory=loop_factory())
    with run:
        # Callers keep connections to the gateway alive: open them once, warm up
        # over them (which also opens the gateway's own pool to the worker), then
        # measure over the same connections, as in steady state.
        conns = run.run(open_connections(server.port, scenario.concurrency))

        def load(payloads: Callable[[int], bytes], total: int) -> LoadResult:
            return run.run(
                run_load(
                    server.port,
                    payloads,
                    total=total,
                    concurrency=scenario.concurrency,
                    request_timeout_s=timeout_s,
                    budget_s=budget_s,
                    connections=conns,
                    first_content=FIRST_CONTENT[scenario.api],
                    done_tail=DONE[scenario.api],
                )
            )

        try:
            written = _lines(receipts)
            load(warm_for, scenario.concurrency)
            # The warm-up's receipts (the last work of each request) are on disk
            # before the measured window opens, and the measured run's before it
            # closes.
            written = _settle(receipts, written + scenario.concurrency)
            server.reset_peak_rss()
            before = _cpu(server, sim)
            measured = load(payload_for, scenario.total)
            _settle(receipts, written + sum(1 for r in measured.results if r.sent))
            after = _cpu(server, sim)
        finally:
            close_connections(conns)
    cpu = {k: after[k] - before[k] for k in before}
    if server is sim:
        cpu["sim"] = cpu["server"]
    return _figures(measured, server, sim, cpu)


def _cpu(server: Child, sim: Child) -> dict[str, float]:
    return {
        "server": server.cpu_s(),
        "server_threads": server.thread_cpu_s(),
        "sim": sim.cpu_s(),
        "client": time.process_time(),
    }


def _lines(path: Path | None) -> int:
    """Receipts in the audit file: its lines but the write-ahead ``open`` ones."""
    if path is None or not path.exists():
        return 0
    data = path.read_bytes()
    opens = data.count(b'\n{"kind":"open"') + data.startswith(b'{"kind":"open"')
    return data.count(b"\n") - opens


def _settle(receipts: Path | None, expected: int, timeout_s: float = 10) -> int:
    """Wait (bounded) until the audit file holds ``expected`` lines; its count."""
    if receipts is not None:
        eventually(lambda: _lines(receipts) >= expected, timeout_s)
    return _lines(receipts)


RATIO_KEYS = (
    "rps",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "stream_p50_ms",
    "cpu_s_per_1000",
    "peak_rss_mb",
)


def _ratios(direct: dict[str, Any], gateway: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        d, g = direct.get(key), gateway.get(key)
        out[key] = round(g / d, 3) if isinstance(d, int | float) and d and g is not None else None
    return out


def _targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    def check(
        name: str, scenario: str, figure: str, limit: float, ratio: bool
    ) -> dict[str, Any] | None:
        entry = results.get(scenario)
        if entry is None:  # not run (--only): neither met nor missed
            return None
        value = (entry["ratio"] if ratio else entry["gateway"]).get(figure)
        return {
            "target": name,
            "value": value,
            "limit": limit,
            "met": value is not None and value <= limit,
        }

    checked = [
        check("latency: gateway CPU s / 1000 req", "latency", "cpu_s_per_1000", 1.0, False),
        check("throughput: gateway CPU s / 1000 req", "throughput", "cpu_s_per_1000", 2.0, False),
        check("latency: TTFT p50 x direct", "latency", "ttft_p50_ms", 6.0, True),
        check("slow: stream p50 x direct", "slow", "stream_p50_ms", 1.05, True),
        check("slow: TTFT p99 x direct", "slow", "ttft_p99_ms", 3.0, True),
        check("slow: gateway peak RSS MB", "slow", "peak_rss_mb", 120.0, False),
        *_vs_chat(results, "responses"),
        *_vs_chat(results, "messages"),
    ]
    targets = [t for t in checked if t is not None]
    slow = results.get("slow")
    if slow is not None:
        complete = slow["gateway"]["ok"] == slow["params"]["total"]
        targets.append(
            {
                "target": "slow: all streams complete",
                "value": complete,
                "limit": True,
                "met": complete,
            }
        )
    errors = sum(e["direct"]["errors"] + e["gateway"]["errors"] for e in results.values())
    targets.append(
        {"target": "no errors, every stream [DONE]", "value": errors, "limit": 0, "met": not errors}
    )
    return targets


def _vs_chat(results: dict[str, Any], api: str) -> list[dict[str, Any] | None]:
    """Responses and Messages cost the gateway about what chat does: their CPU
    per 1000 streams, and (latency) their TTFT p50 ratio to direct, each within
    1.25x of the chat scenario's figure in the same run (same concurrency,
    count and chunks)."""

    def ratio(scenario: str, side: str, figure: str) -> float | None:
        entry = results.get(scenario)
        chat = results.get(VS_CHAT[scenario])
        if entry is None or chat is None:
            return None
        value, base = entry[side].get(figure), chat[side].get(figure)
        if not isinstance(value, int | float) or not isinstance(base, int | float) or not base:
            return None
        return round(value / base, 3)

    def target(name: str, scenario: str, figure: str, side: str) -> dict[str, Any] | None:
        if scenario not in results or VS_CHAT[scenario] not in results:
            return None  # not run (--only)
        value = ratio(scenario, side, figure)
        return {
            "target": name,
            "value": value,
            "limit": 1.25,
            "met": value is not None and value <= 1.25,
        }

    return [
        target(
            f"{api}_latency: gateway CPU s / 1000 x chat's",
            f"{api}_latency",
            "cpu_s_per_1000",
            "gateway",
        ),
        target(
            f"{api}_throughput: gateway CPU s / 1000 x chat's",
            f"{api}_throughput",
            "cpu_s_per_1000",
            "gateway",
        ),
        target(
            f"{api}_latency: TTFT p50 x direct, x chat's",
            f"{api}_latency",
            "ttft_p50_ms",
            "ratio",
        ),
    ]


# ----------------------------------------------------------------- report


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def table(report: dict[str, Any]) -> str:
    # The nginx and gw/nginx columns only when nginx ran (--nginx).
    with_nginx = any("nginx" in e for e in report["scenarios"].values())
    sides = ("direct", "gateway", "nginx") if with_nginx else ("direct", "gateway")
    rows: list[tuple[str, ...]] = [("scenario", "figure", "direct", "gateway", "ratio")]
    if with_nginx:
        rows[0] += ("nginx", "gw/nginx")

    def cells(
        first: str, label: str, values: list[str], ratio: str, vs_nginx: str
    ) -> tuple[str, ...]:
        out = (first, label, values[0], values[1], ratio)
        return (*out, values[2], vs_nginx) if with_nginx else out

    for name, entry in report["scenarios"].items():
        figures = [entry.get(side) for side in sides]
        r = entry["ratio"]
        n = entry.get("nginx")
        vs_nginx = _ratios(n, entry["gateway"]) if n is not None else None
        ok_sent = [f"{f['ok']}/{f['sent']}" if f else "-" for f in figures]
        rows.append(cells(name, "ok/sent", ok_sent, "", ""))
        for key, label in (
            ("rps", "req/s"),
            ("ttft_p50_ms", "TTFT p50 ms"),
            ("ttft_p99_ms", "TTFT p99 ms"),
            ("stream_p50_ms", "stream p50 ms"),
            ("cpu_s_per_1000", "CPU s/1000 req (*)"),
            ("peak_rss_mb", "peak RSS MB (*)"),
        ):
            values = [_fmt(f[key]) if f else "-" for f in figures]
            gw_nginx = _fmt(vs_nginx[key]) if vs_nginx is not None else "-"
            rows.append(cells("", label, values, _fmt(r[key]), gw_nginx))
        errors = [str(f["errors"]) if f else "-" for f in figures]
        rows.append(cells("", "errors", errors, "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    footnote = "(*) direct: the simulator process; gateway: the gateway process alone"
    if with_nginx:
        footnote += "; nginx: master + worker CPU, the worker's RSS"
    lines.append(footnote)
    lines.append("")
    for t in report["targets"]:
        mark = "ok  " if t["met"] else "MISS"
        lines.append(f"[{mark}] {t['target']}: {_fmt(t['value'])} (limit {_fmt(t['limit'])})")
    return "\n".join(lines)


# ------------------------------------------------------------------- main


def _start_profiler(
    directory: Path | None, pid: int, name: str, cpus: set[int] | None
) -> Child | None:
    """py-spy on the gateway PID for one scenario (``--profile``; developer aid)."""
    if directory is None:
        return None
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        raise SystemExit("--profile needs py-spy: pip install -e '.[profile]'")
    directory.mkdir(parents=True, exist_ok=True)
    argv = [str(spy), "record", "--nonblocking", "-r", "1000", "-f", "raw", "-p", str(pid)]
    # Off the gateway's CPU: a sampler sharing it would be counted as its cost.
    out = str(directory / f"{name}.txt")
    child = Child(f"py-spy-{name}", [*argv, "-o", out], directory, {}, cpus=cpus)
    if not eventually(lambda: b"Sampling process" in child.stdout_path.read_bytes(), 10):
        child.stop()
        raise RuntimeError("py-spy did not attach to the gateway")
    return child


def _placement() -> dict[str, set[int]] | None:
    """CPU sets: the gateway alone on one CPU, simulator and load client on the rest.

    As deployed, the sidecar has its own CPU and the worker and the callers
    run elsewhere. Unpinned, the three processes migrate across two cores and
    a run's TTFT figures swing by 2x from scheduling alone. The direct column
    gets the same placement for simulator and client, so ratios compare like
    with like. None (no pinning) with fewer than two CPUs.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return None
    if len(cpus) < 2:
        return None
    rest = set(cpus[1:])
    return {"gateway": {cpus[0]}, "simulator": rest, "load client": rest}


def run(
    quick: bool,
    out: Path,
    only: list[str] | None = None,
    profile: Path | None = None,
    latency_requests: int | None = None,
    nginx: bool = False,
) -> dict[str, Any]:
    scenarios = tuple(s for s in (QUICK if quick else FULL) if not only or s.name in only)
    if latency_requests is not None:
        scenarios = tuple(
            dataclasses.replace(s, total=latency_requests) if s.concurrency == 1 else s
            for s in scenarios
        )
    budget_s, timeout_s = (15.0, 10.0) if quick else (60.0, 30.0)
    capacity = max(s.concurrency * 8 for s in scenarios) + 64
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    children: list[Child] = []
    placement = _placement()
    before_affinity = os.sched_getaffinity(0)
    nginx_bin = nginx_binary() if nginx else None
    if nginx and nginx_bin is None:
        print("--nginx: no nginx binary (PATH, /usr/sbin/nginx); the nginx column is skipped")
    try:
        if placement is not None:
            os.sched_setaffinity(0, placement["load client"])
        sim = start_simulator(workdir, env, None if placement is None else placement["simulator"])
        children.append(sim)
        config = _config(workdir, sim.port, capacity)
        gw = Child(
            "gateway",
            [*gateway_command(), "serve", "--config", str(config), "--port", "0"],
            workdir,
            env,
            cpus=None if placement is None else placement["gateway"],
        )
        children.append(gw)
        gw.wait_listening()
        wait_ready(gw.port)
        tokens = _tokens(secret)
        staged = _upload_samples(gw.port, tokens[0])
        sides: list[tuple[str, Child]] = [("direct", sim), ("gateway", gw)]
        if nginx_bin is not None:
            # The reference proxy: on the gateway's CPU, in front of the same simulator.
            proxy = Nginx(
                nginx_bin,
                workdir,
                sim.port,
                env,
                cpus=None if placement is None else placement["gateway"],
            )
            children.append(proxy)
            proxy.wait_serving()
            sides.append(("nginx", proxy))
        results: dict[str, Any] = {}
        client_cpus = None if placement is None else placement["load client"]
        for scenario in scenarios:
            directive = f"[[sim chunks={scenario.chunks} delay_ms={scenario.delay_ms:g}]]"
            warm = "[[sim chunks=2 delay_ms=50]]"
            entry: dict[str, Any] = {"params": scenario.__dict__.copy()}
            for target, server in sides:
                via = server is gw
                spy = _start_profiler(profile, gw.pid, scenario.name, client_cpus) if via else None
                media: list[tuple[str, str]] = []
                if scenario.multimodal:
                    media = [(k, f"evidence:{i}") for k, i in staged] if via else _direct_media()
                entry[target] = _measure(
                    scenario,
                    server,
                    sim,
                    _payloads(server.port, via, directive, tokens, media, scenario.api),
                    _payloads(server.port, via, warm, tokens, media, scenario.api),
                    budget_s,
                    timeout_s,
                    workdir / "var" / "receipts.jsonl" if via else None,
                )
                if spy is not None:
                    spy.stop(sig=signal.SIGINT)  # py-spy writes its output on SIGINT
            entry["ratio"] = _ratios(entry["direct"], entry["gateway"])
            results[scenario.name] = entry
        gateway_log_lines = gw.stderr_path.read_bytes().count(b"\n")
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if placement is not None:
            os.sched_setaffinity(0, before_affinity)
    report: dict[str, Any] = {
        "version": 1,
        "quick": quick,
        "cpus": os.cpu_count(),
        "placement": None if placement is None else {k: sorted(v) for k, v in placement.items()},
        "python": sys.version.split()[0],
        "elapsed_s": round(time.monotonic() - started, 1),
        "gateway_log_lines": gateway_log_lines,
        "scenarios": results,
        "targets": _targets(results),
    }
    if nginx_bin is not None:
        report["nginx"] = nginx_version(nginx_bin)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument("--only", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--profile", type=Path, help="py-spy the gateway into this folder")
    parser.add_argument(
        "--latency-requests", type=int, help="requests of the C=1 scenarios (bench.budget)"
    )
    parser.add_argument(
        "--nginx", action="store_true", help="also measure a plain nginx proxy (reference)"
    )
    args = parser.parse_args(argv)
    report = run(
        args.quick, args.out, args.only, args.profile, args.latency_requests, nginx=args.nginx
    )
    print(table(report))
    print()
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    print(f"\nJSON written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
