"""Gateway memory for requests that name big evidence (issue "Bounded before admitted").

Run: ``.venv/bin/python -m bench.bench_media [--quick]``.

Starts the protocol simulator and ``mistralrs-gateway serve`` as child
processes on 127.0.0.1 (``data_url`` mode, the tenant allowed 4 parts and
20 MB of media), stages big evidence through the upload API, and reports the
gateway process's peak RSS (``VmHWM``, reset before each scenario with
``clear_refs``) above its idle RSS:

- ``refused``: one request naming one 19 MiB record four times (over 20 MB):
  refused from the catalog records, before admission;
- ``one_admitted``: one request naming a 19 MiB record once, sent to the
  worker as a ~26 MB body;
- ``concurrent``: 40 concurrent requests each naming three 6.6 MB records
  (26.4 MB bodies), through 8 admission permits;
- ``uploads``: 30 concurrent 19 MiB uploads (``staging.max_concurrent_uploads``
  4 are read, to temp files in 1 MiB pieces; the rest get 429 ``queue_full``).

Targets (from the issue): ``refused`` ≤ 20 MB above idle, ``concurrent`` peak
RSS ≤ 200 MB. Bounded: every wait has a deadline; children are stopped in a
``finally``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Child, start_simulator, wait_ready
from bench.run import ALIAS, TENANT, _tokens
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    default_policy,
    new_dev_secret,
    write_config,
)
from gateway.testing.samples import SAMPLES

MIB = 1024 * 1024
PNG_HEAD = SAMPLES["tiny.png"]()[:64]


def _png(size: int, salt: int) -> bytes:
    """``size`` bytes the sniffer takes for a PNG; ``salt`` makes each file distinct."""
    marker = salt.to_bytes(8, "big") * 16
    return PNG_HEAD + marker + b"\0" * (size - len(PNG_HEAD) - len(marker))


def _config(workdir: Path, sim_port: int) -> Path:
    policy = default_policy(
        TENANT,
        limits={
            "max_output_tokens": 64,
            "requests_per_minute": 10_000_000,
            "max_media_parts": 4,
            "max_media_bytes": 20_000_000,
            "max_body_bytes": 65_536,
        },
        admission={"share": 1, "max_permits": 8, "queue_timeout_s": 120},
        evidence={"max_records": 100, "max_bytes": 10_000_000_000},
    )
    return write_config(
        workdir,
        upstream_port=sim_port,
        policies={TENANT: policy},
        upstream={"readiness_poll_s": 2, "readiness_timeout_s": 2, "total_timeout_s": 300},
        admission={"capacity": 8, "max_queue": 64},
        staging={"dir": "var/evidence", "catalog": "var/catalog.sqlite3"},
        audit={"path": "var/receipts.jsonl"},
    )


def _upload(url: str, token: str, data: bytes) -> str:
    response = httpx.post(
        f"{url}/v1/evidence",
        content=data,
        headers={"authorization": f"Bearer {token}", "content-type": "image/png"},
        timeout=60,
    )
    if response.status_code != 201:
        raise RuntimeError(f"upload failed: {response.status_code} {response.text[:200]}")
    evidence_id: str = response.json()["id"]
    return evidence_id


def _chat(url: str, token: str, ids: list[str]) -> int:
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"evidence:{i}"}} for i in ids
    ]
    content.append({"type": "text", "text": "describe [[sim chunks=4]]"})
    body = {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=300,
    )
    return response.status_code


def _peak_above_idle(gw: Child, run: Any) -> dict[str, float]:
    idle = gw.status_kb("VmRSS") / 1024
    gw.reset_peak_rss()
    started = time.monotonic()
    statuses = run()
    wall = time.monotonic() - started
    peak = gw.status_kb("VmHWM") / 1024
    return {
        "idle_rss_mb": round(idle, 1),
        "peak_rss_mb": round(peak, 1),
        "above_idle_mb": round(peak - idle, 1),
        "wall_s": round(wall, 2),
        "statuses": statuses,
    }


def run(quick: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-media-"))
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    concurrency = 8 if quick else 40
    try:
        sim = start_simulator(workdir, env)
        children.append(sim)
        config = _config(workdir, sim.port)
        gw = Child(
            "gateway",
            [
                sys.executable,
                "-m",
                "gateway.tools.cli",
                "serve",
                "--config",
                str(config),
                "--port",
                "0",
            ],
            workdir,
            env,
        )
        children.append(gw)
        gw.wait_listening()
        wait_ready(gw.port)
        url = f"http://127.0.0.1:{gw.port}"
        token = _tokens(secret)[1]  # HS256: the issuer write_config sets up
        big = _upload(url, token, _png(19 * MIB, 0))
        mids = [_upload(url, token, _png(6_600_000, n + 1)) for n in range(3)]
        results = {
            "refused": _peak_above_idle(gw, lambda: [_chat(url, token, [big] * 4)]),
            "one_admitted": _peak_above_idle(gw, lambda: [_chat(url, token, [big])]),
        }

        def concurrent() -> list[int]:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                return list(pool.map(lambda _: _chat(url, token, mids), range(concurrency)))

        results["concurrent"] = _peak_above_idle(gw, concurrent)
        results["concurrent"]["requests"] = concurrency
        bodies = [_png(19 * MIB, 100 + n) for n in range(8 if quick else 30)]

        def uploads() -> list[int]:
            def one(data: bytes) -> int:
                response = httpx.post(
                    f"{url}/v1/evidence",
                    content=data,
                    headers={"authorization": f"Bearer {token}", "content-type": "image/png"},
                    timeout=120,
                )
                return response.status_code

            with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
                return list(pool.map(one, bodies))

        results["uploads"] = _peak_above_idle(gw, uploads)
    finally:
        for child in reversed(children):
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 concurrent instead of 40")
    args = parser.parse_args(argv)
    results = run(args.quick)
    print(f"{'scenario':<14}{'idle MB':>9}{'peak MB':>9}{'above idle':>12}{'wall s':>8}  statuses")
    for name, r in results.items():
        statuses = sorted(set(r["statuses"]))
        print(
            f"{name:<14}{r['idle_rss_mb']:>9}{r['peak_rss_mb']:>9}{r['above_idle_mb']:>12}"
            f"{r['wall_s']:>8}  {statuses} x{len(r['statuses'])}"
        )
    refused = results["refused"]
    concurrent = results["concurrent"]
    checks = [
        ("refused 4x19 MiB: MB above idle", refused["above_idle_mb"], 20.0),
        (
            f"{concurrent['requests']} x 3x6.6 MB: gateway peak RSS MB",
            concurrent["peak_rss_mb"],
            200.0,
        ),
    ]
    ok = refused["statuses"] == [400] and set(concurrent["statuses"]) == {200}
    ok = ok and set(results["uploads"]["statuses"]) <= {201, 429}
    for label, value, limit in checks:
        met = value <= limit
        ok = ok and met
        print(f"[{'ok  ' if met else 'MISS'}] {label}: {value} (limit {limit})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
