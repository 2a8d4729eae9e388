"""Smoke test: ``bench.run --quick`` runs end to end and reports every figure.

No timed assertions: only the JSON shape and zero errors.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from bench.run import RATIO_KEYS, _targets

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {
    "latency",
    "throughput",
    "slow",
    "multimodal",
    "responses_latency",
    "responses_throughput",
    "messages_latency",
    "messages_throughput",
}
FIGURES = {"sent", "ok", "errors", "error_kinds", *RATIO_KEYS}


def test_quick_bench_reports_every_scenario_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"TTFT p50 ms" in done.stdout
    report = orjson.loads(out.read_bytes())
    assert report["quick"] is True
    assert set(report["scenarios"]) == SCENARIOS
    for name, entry in report["scenarios"].items():
        for side in ("direct", "gateway"):
            figures = entry[side]
            assert set(figures) >= FIGURES, (name, side)
            assert figures["errors"] == 0, (name, side, figures["error_kinds"])
            assert figures["ok"] == figures["sent"] == entry["params"]["total"]
            # every stream's first content event was seen (chat chunks and named events)
            assert figures["ttft_p50_ms"] is not None, (name, side)
        assert set(entry["ratio"]) >= {"rps", "ttft_p50_ms", "cpu_s_per_1000"}
    targets = report["targets"]
    assert {t["target"] for t in targets} == {
        "latency: gateway CPU s / 1000 req",
        "throughput: gateway CPU s / 1000 req",
        "latency: TTFT p50 x direct",
        "slow: stream p50 x direct",
        "slow: TTFT p99 x direct",
        "slow: gateway peak RSS MB",
        "responses_latency: gateway CPU s / 1000 x chat's",
        "responses_throughput: gateway CPU s / 1000 x chat's",
        "responses_latency: TTFT p50 x direct, x chat's",
        "messages_latency: gateway CPU s / 1000 x chat's",
        "messages_throughput: gateway CPU s / 1000 x chat's",
        "messages_latency: TTFT p50 x direct, x chat's",
        "slow: all streams complete",
        "no errors, every stream [DONE]",
    }
    assert all(set(t) == {"target", "value", "limit", "met"} for t in targets)


def test_only_the_scenarios_run_are_judged() -> None:
    """``--only latency`` judges latency's targets and the error count, and
    reports no target of a scenario it did not run as missed."""
    figures = {"cpu_s_per_1000": 0.9, "ttft_p50_ms": 1.2, "errors": 0}
    results = {
        "latency": {
            "direct": {"errors": 0},
            "gateway": figures,
            "ratio": {"cpu_s_per_1000": 3.0, "ttft_p50_ms": 4.0},
        }
    }
    assert {(t["target"], t["met"]) for t in _targets(results)} == {
        ("latency: gateway CPU s / 1000 req", True),
        ("latency: TTFT p50 x direct", True),
        ("no errors, every stream [DONE]", True),
    }


def test_quick_media_bench_runs_and_reports_each_scenario() -> None:
    """``bench.bench_media --quick``: every scenario answered as designed (the
    refusal 400, the admitted ones 200, uploads 201 or 429); figures printed."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_media", "--quick"],
        cwd=ROOT,
        capture_output=True,
        timeout=180,
        check=False,
    )
    out = done.stdout.decode(errors="replace")
    for name in ("refused", "one_admitted", "concurrent", "uploads"):
        assert f"\n{name}" in out, out
    assert "[400] x1" in out and "[200] x8" in out, out
    assert "Traceback" not in done.stderr.decode(errors="replace")


def test_images_speech_bench_prints_each_scenarios_figures() -> None:
    """``bench.bench_images_speech``: the scenarios asked for, each answered 200,
    a row of figures each (exit 0 only when every request was 200)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_images_speech", "--repeat", "1", "image_n4", "speech"],
        cwd=ROOT,
        capture_output=True,
        timeout=180,
        check=False,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, out + done.stderr.decode(errors="replace")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert set(rows) == {"image_n4", "speech"} and all(r[0] == "200" for r in rows.values())


def test_quick_redis_bench_reports_both_stores_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "redis.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_redis", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"store reserve p99" in done.stdout
    report = orjson.loads(out.read_bytes())
    for store in ("memory", "redis"):
        figures = report["gateway"][store]
        assert figures["errors"] == {} and figures["ok"] == 20
        assert figures["ttft_p50_ms"] > 0 and figures["cpu_s_per_1000"] >= 0
        assert report["store_reserve"][store]["p99_us"] > 0
    assert report["gateway_reserve_histogram"]["count"] >= 25  # every request reserved
    assert {t["target"] for t in report["targets"]} == {
        "redis - memory: ttft_p50_ms",
        "redis - memory: cpu_s_per_1000",
    }


def _quick(module: str) -> str:
    """``python -m <module> --quick``: what it printed (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick"],
        cwd=ROOT,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


def test_quick_state_bench_reports_both_backends_without_errors() -> None:
    out = _quick("bench.bench_state")
    for name in ("plain", "evidence2", "followup"):
        for backend in ("sqlite", "postgres"):
            row = next(
                line.split() for line in out.splitlines() if line.split()[:2] == [name, backend]
            )
            assert row[2] == "20/20", out  # every request answered
            assert float(row[3]) > 0, out
        assert any(line.startswith(name) and "pg - sqlite" in line for line in out.splitlines())


def test_quick_release_bench_runs_both_aliases_without_errors() -> None:
    out = _quick("bench.bench_release")
    assert out.count("ok 40/40") == 2, out  # every request through both aliases answered
    assert "release - plain:" in out
