"""Gateway CPU and peak RSS of image and speech requests (issue 34, spec §23).

Run: ``.venv/bin/python -m bench.bench_images_speech [--repeat N]``.

For each scenario, starts the protocol simulator (a chat, an image and a
speech route) and ``mistralrs-gateway serve`` as child processes on
127.0.0.1 (fresh ones: memory an earlier scenario freed but kept would hide
this one's peak), warms them up with a small image and speech request, then
sends the scenario ``--repeat`` times, one request at a time, and reports for
the gateway process: CPU seconds (utime + stime) per request (median), and
its peak RSS (``VmHWM``, reset before each request with ``clear_refs``)
above its RSS just before (the largest), also as a multiple of the payload
(the decoded PNGs, or the WAV):

- ``image``: one 1024x1024 image (the simulator's PNG is a few KiB);
- ``image_16mib``: one image padded to 16 MiB (``images.max_bytes``): the
  worker sends ~22 MB of base64 in its JSON;
- ``image_n4``: four 1 MiB images (four worker calls, one answer);
- ``image_url``: one 16 MiB image as ``response_format: url`` (stored as a
  tenant file, then a link);
- ``speech``: a short WAV (60 ms a character of input);
- ``speech_64mib``: a 64 MiB WAV (``speech.max_output_bytes``).

The issue's bound: a 16 MiB image and a 64 MiB WAV raise peak RSS by at most
2x their size. Bounded: every wait has a deadline; children are stopped by
PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Child, wait_ready
from bench.run import TENANT, _tokens
from gateway.testing.harness import (
    DEMO_SECRET_ENV,
    SIM_ROUTE,
    default_policy,
    new_dev_secret,
    write_config,
)

MIB = 1024 * 1024
IMAGE_ROUTE, SPEECH_ROUTE = "/srv/models/flux-sim", "/srv/models/dia-sim"
#: a 16 MiB PNG (images.max_bytes), a 64 MiB WAV (speech.max_output_bytes)
IMAGE_BYTES, WAV_BYTES = 16 * MIB, 64 * MIB


@dataclass(frozen=True, slots=True)
class Scenario:
    path: str
    body: dict[str, Any]
    #: the payload the bound is measured against (decoded PNGs, or the WAV)
    payload: int


SCENARIOS: dict[str, Scenario] = {
    "image": Scenario("/v1/images/generations", {"model": "flux", "prompt": "a fox"}, 0),
    "image_16mib": Scenario(
        "/v1/images/generations",
        {"model": "flux", "prompt": f"a fox [[sim image_bytes={IMAGE_BYTES}]]"},
        IMAGE_BYTES,
    ),
    "image_n4": Scenario(
        "/v1/images/generations",
        {"model": "flux", "prompt": f"a fox [[sim image_bytes={MIB}]]", "n": 4},
        4 * MIB,
    ),
    "image_url": Scenario(
        "/v1/images/generations",
        {
            "model": "flux",
            "prompt": f"a fox [[sim image_bytes={IMAGE_BYTES}]]",
            "response_format": "url",
        },
        IMAGE_BYTES,
    ),
    "speech": Scenario("/v1/audio/speech", {"model": "dia", "input": "Hello there."}, 0),
    "speech_64mib": Scenario(
        "/v1/audio/speech",
        {"model": "dia", "input": f"Hello [[sim audio_bytes={WAV_BYTES}]]"},
        WAV_BYTES,
    ),
}


@dataclass(slots=True)
class Stack:
    url: str
    token: str
    gateway: Child


def _config(workdir: Path, sim_port: int) -> Path:
    policy = default_policy(
        TENANT,
        models={"flux": IMAGE_ROUTE, "dia": SPEECH_ROUTE, "gemma-4-mm": SIM_ROUTE},
        endpoints=["images", "speech", "models"],
        limits={"max_output_tokens": 64, "requests_per_minute": 10_000_000},
    )
    routes = [
        SIM_ROUTE,
        {"route": IMAGE_ROUTE, "kind": "image"},
        {"route": SPEECH_ROUTE, "kind": "speech"},
    ]
    upstream = {
        "name": "default",
        "base_url": f"http://127.0.0.1:{sim_port}",
        "routes": routes,
        "total_timeout_s": 300,
    }
    return write_config(
        workdir,
        upstream_port=sim_port,
        policies={TENANT: policy},
        upstreams=[upstream],
        server={"public_base_url": "http://127.0.0.1"},
    )


@contextmanager
def running(workdir: Path) -> Iterator[Stack]:
    """The simulator and the gateway as child processes, stopped by PID at the end."""
    secret = new_dev_secret()
    env = {**os.environ, DEMO_SECRET_ENV: secret, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    try:
        sim_argv = [sys.executable, "-m", "gateway.testing.simulator", "--port", "0"]
        sim_argv += ["--model-id", SIM_ROUTE, "--image-model", IMAGE_ROUTE]
        sim_argv += ["--speech-model", SPEECH_ROUTE]
        sim = Child("simulator", sim_argv, workdir, env)
        children.append(sim)
        sim.wait_listening()
        config = _config(workdir, sim.port)
        gw_argv = [sys.executable, "-m", "gateway.tools.cli", "serve", "--config", str(config)]
        gateway = Child("gateway", [*gw_argv, "--port", "0"], workdir, env)
        children.append(gateway)
        gateway.wait_listening()
        wait_ready(gateway.port)
        yield Stack(f"http://127.0.0.1:{gateway.port}", _tokens(secret)[1], gateway)
    finally:
        for child in reversed(children):
            child.stop()


def measure(stack: Stack, scenario: Scenario) -> dict[str, float]:
    """One request: its status, size, gateway CPU and peak RSS above the RSS before it."""
    gw = stack.gateway
    before_rss = gw.status_kb("VmRSS") * 1024
    gw.reset_peak_rss()
    cpu = gw.cpu_s()
    started = time.monotonic()
    with httpx.Client(base_url=stack.url, timeout=300) as client:
        response = client.post(
            scenario.path,
            json=scenario.body,
            headers={"authorization": f"Bearer {stack.token}"},
        )
    wall = time.monotonic() - started
    # The receipt and the freeing happen just after the last byte: a short settle.
    time.sleep(0.2)
    peak = gw.status_kb("VmHWM") * 1024 - before_rss
    return {
        "status": response.status_code,
        "answer_bytes": len(response.content),
        "cpu_s": gw.cpu_s() - cpu,
        "wall_s": wall,
        "peak_above_mb": peak / MIB,
        "peak_x_payload": peak / scenario.payload if scenario.payload else 0.0,
    }


def run(names: list[str], repeat: int) -> dict[str, dict[str, float]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-media-calls-"))
    results: dict[str, dict[str, float]] = {}
    try:
        for name in names:
            scenario_dir = workdir / name
            scenario_dir.mkdir()
            with running(scenario_dir) as stack:
                measure(stack, SCENARIOS["image"])  # warm up (imports, pools)
                measure(stack, SCENARIOS["speech"])
                runs = [measure(stack, SCENARIOS[name]) for _ in range(repeat)]
                statuses = {r["status"] for r in runs}
                results[name] = {
                    "status": statuses.pop() if len(statuses) == 1 else -1,
                    "answer_mb": runs[0]["answer_bytes"] / MIB,
                    "cpu_ms": statistics.median(r["cpu_s"] for r in runs) * 1000,
                    "wall_ms": statistics.median(r["wall_s"] for r in runs) * 1000,
                    "peak_above_mb": max(r["peak_above_mb"] for r in runs),
                    "peak_x_payload": max(r["peak_x_payload"] for r in runs),
                }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="requests per scenario")
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args(argv)
    results = run(args.scenarios, max(1, min(args.repeat, 20)))
    print(
        f"{'scenario':<14}{'status':>7}{'answer MB':>11}{'CPU ms':>9}{'wall ms':>9}"
        f"{'peak +MB':>10}{'x payload':>11}"
    )
    for name, r in results.items():
        print(
            f"{name:<14}{r['status']:>7.0f}{r['answer_mb']:>11.2f}{r['cpu_ms']:>9.1f}"
            f"{r['wall_ms']:>9.1f}{r['peak_above_mb']:>10.1f}{r['peak_x_payload']:>11.2f}"
        )
    return 0 if all(r["status"] == 200 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
