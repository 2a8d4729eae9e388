"""Smoke test of the open-loop overhead bench (``bench.overhead``).

No timed assertions: the schedule's shape, and a one-second run at a low
rate direct and through the gateway that prints every figure with no error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bench.openloop import arrivals
from bench.overhead import ADDED, COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def test_poisson_arrivals_are_bounded_sorted_and_near_the_rate() -> None:
    times = arrivals(500, 4, seed=3)
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 4
    assert 1800 < len(times) < 2200  # 2,000 expected; sd ~45
    # A seed is a schedule: the same one for every target of a rate.
    assert arrivals(500, 4, seed=3) == times != arrivals(500, 4, seed=4)


def test_uniform_arrivals_are_evenly_spaced() -> None:
    assert arrivals(4, 1, process="uniform") == [0.0, 0.25, 0.5, 0.75]
    assert arrivals(0, 10) == []
    with pytest.raises(ValueError):
        arrivals(1, 1, process="bursty")


def test_a_one_second_run_prints_every_figure_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = [sys.executable, "-m", "bench.overhead", "--rates", "20", "--duration", "1"]
    argv += ["--warmup", "0.5", "--no-nginx", "--no-litellm", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=120, check=False)
    printed = done.stdout.decode(errors="replace")
    assert done.returncode == 0, printed + done.stderr.decode(errors="replace")[-2000:]
    for _, label in COLUMNS:
        assert label in printed, label
    report = orjson.loads(out.read_bytes())
    entry = report["rates"]["20"]
    assert set(entry) == {"direct", "gateway"}
    for target, figures in entry.items():
        assert figures["errors"] == 0, (target, figures["error_kinds"])
        assert figures["ok"] == figures["sent"] > 5  # ~20 scheduled in the second
        assert figures["latency_p99_ms"] >= figures["latency_p50_ms"] > 0
        assert figures["ttft_p50_ms"] is not None  # the streamed half's first content seen
        assert figures["cpu_ms_per_request"] is not None
    assert {name for _, name in ADDED} <= set(entry["gateway"])
    assert report["placement"]["proxy"] != report["placement"]["simulator and load generator"]
