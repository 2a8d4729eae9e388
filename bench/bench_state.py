"""``make bench``'s state phase: what the books cost per request, SQLite against
PostgreSQL (spec §17), in one run.

Two gateways on one simulator, one on the embedded SQLite state and one on a
throwaway loopback PostgreSQL (``tests/support/postgres.py``; durability off,
so the figure is the driver's and the round trips', not a disk's). Three
scenarios at C=1 through each: a chat naming no evidence (which makes no
state call), a chat naming two evidence records (two lookups, the leases,
their release) and a Responses follow-up (the conversation read, the answer
kept before ``[DONE]``). Reported: TTFT p50 and CPU per 1,000 per backend, and
PostgreSQL minus SQLite.

    python -m bench.bench_state [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.loadgen import http_post
from bench.procs import Child, gateway_command, start_simulator, wait_ready
from bench.run import ALIAS, Scenario, _body, _config, _measure, _tokens
from gateway.testing.harness import DEMO_SECRET_ENV, new_dev_secret
from gateway.testing.samples import SAMPLES
from tests.support.postgres import postgres_server

DSN_ENV = "GATEWAY_STATE_DSN"
SCENARIOS = ("plain", "evidence2", "followup")


def _setup(port: int, token: str) -> tuple[list[str], str]:
    """Two staged images and one kept response to follow up on."""
    auth = {"authorization": f"Bearer {token}"}
    png = SAMPLES["tiny.png"]()
    ids = []
    for tail in (b"", b"\0"):
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/evidence",
            content=png + tail,
            headers={**auth, "content-type": "image/png"},
            timeout=10,
        )
        answer.raise_for_status()
        ids.append(answer.json()["id"])
    first = httpx.post(
        f"http://127.0.0.1:{port}/v1/responses",
        json={"model": ALIAS, "input": "the first turn", "max_output_tokens": 16},
        headers=auth,
        timeout=10,
    )
    first.raise_for_status()
    return ids, str(first.json()["id"])


def _payloads(
    port: int, tokens: list[str], name: str, directive: str, ids: list[str], previous: str
) -> Callable[[int], bytes]:
    text = f"bench {directive}"
    if name == "followup":
        body = orjson.dumps(
            {
                "model": ALIAS,
                "stream": True,
                "max_output_tokens": 128,
                "input": text,
                "previous_response_id": previous,
            }
        )
        path = "/v1/responses"
    else:
        media = [("image", f"evidence:{i}") for i in ids] if name == "evidence2" else []
        body = _body(ALIAS, text, media, "chat")
        path = "/v1/chat/completions"
    requests = [http_post(port, path, body, {"authorization": f"Bearer {t}"}) for t in tokens]
    return lambda i: requests[i % len(requests)]


def run_state(quick: bool) -> dict[str, Any]:
    total = 20 if quick else 200
    budget_s, timeout_s = (15.0, 10.0) if quick else (60.0, 30.0)
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-state-"))
    secret = new_dev_secret()
    results: dict[str, Any] = {}
    children: list[Child] = []
    try:
        with postgres_server() as pg:
            env = {**os.environ, DEMO_SECRET_ENV: secret, DSN_ENV: pg.dsn, "PYTHONUNBUFFERED": "1"}
            sim = start_simulator(workdir, env, None)
            children.append(sim)
            tokens = _tokens(secret)
            for backend in ("sqlite", "postgres"):
                home = workdir / backend
                home.mkdir()
                state = {"backend": backend, "dsn_env": DSN_ENV}
                config = _config(home, sim.port, 64, state)
                argv = [*gateway_command(), "serve", "--config", str(config), "--port", "0"]
                gw = Child(f"gateway-{backend}", argv, home, env)
                children.append(gw)
                gw.wait_listening()
                wait_ready(gw.port)
                ids, previous = _setup(gw.port, tokens[0])
                for name in SCENARIOS:
                    api = "responses" if name == "followup" else "chat"
                    scenario = Scenario(f"state_{name}", 1, total, 16, api=api)
                    directive = "[[sim chunks=16 delay_ms=0]]"
                    warm = "[[sim chunks=2 delay_ms=0]]"
                    figures = _measure(
                        scenario,
                        gw,
                        sim,
                        _payloads(gw.port, tokens, name, directive, ids, previous),
                        _payloads(gw.port, tokens, name, warm, ids, previous),
                        budget_s,
                        timeout_s,
                        home / "var" / "receipts.jsonl",
                    )
                    results.setdefault(name, {})[backend] = figures
                gw.stop()
                children.remove(gw)
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for entry in results.values():
        sqlite, postgres = entry["sqlite"], entry["postgres"]
        entry["postgres_minus_sqlite"] = {
            "ttft_p50_ms": _minus(postgres["ttft_p50_ms"], sqlite["ttft_p50_ms"]),
            "cpu_s_per_1000": _minus(postgres["cpu_s_per_1000"], sqlite["cpu_s_per_1000"]),
        }
    return results


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def table(results: dict[str, Any]) -> str:
    rows = [("state scenario", "backend", "ok", "TTFT p50 ms", "CPU s/1000", "peak RSS MB")]
    for name, entry in results.items():
        for backend in ("sqlite", "postgres"):
            f = entry[backend]
            rows.append(
                (
                    name,
                    backend,
                    f"{f['ok']}/{f['sent']}",
                    str(f["ttft_p50_ms"]),
                    str(f["cpu_s_per_1000"]),
                    str(f["peak_rss_mb"]),
                )
            )
        delta = entry["postgres_minus_sqlite"]
        rows.append((name, "pg - sqlite", "", f"{delta['ttft_p50_ms']:+}", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_state", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts (smoke test)")
    args = parser.parse_args(argv)
    print(table(run_state(args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
