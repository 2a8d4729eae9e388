"""Smoke test: ``bench.bench_engine`` runs end to end on the tiny model (no timed assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_engine_bench_runs_and_reports_its_figures() -> None:
    argv = ["--size", "tiny", "--pairs", "1", "--requests", "1", "--max-tokens", "16"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_engine", *argv],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    lines = done.stdout.decode().splitlines()
    result = json.loads(lines[-1])
    assert set(result) >= {"ratio", "ratio_of_totals", "gateway_cpu_s_per_1000_tokens"}
    assert len(result["pair_ratios"]) == 1
    rows = [line.split()[:2] for line in lines if line[:3].strip().isdigit()]
    assert rows == [["1", "gateway"], ["2", "direct"]]
