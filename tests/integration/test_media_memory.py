"""A 16 MiB image and a 64 MiB WAV through a real ``serve`` process (issue 34):
each raises the gateway's peak RSS by at most twice its size.

The worker's answer is held once (an image as its ~21 MiB of base64, a WAV as
its bytes) while it is checked, and the caller's answer is sent as views into
it, 1 MiB at a time (bench/bench_images_speech.py measures the same, and CPU).
Each scenario gets fresh processes: memory one freed but kept would hide the
other's peak.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_images_speech import IMAGE_BYTES, SCENARIOS, WAV_BYTES, measure, running


@pytest.mark.parametrize(
    ("name", "answer_bytes"),
    [("image_16mib", IMAGE_BYTES * 4 // 3), ("speech_64mib", WAV_BYTES)],
)
def test_big_media_answers_stay_under_twice_their_size(
    tmp_path: Path, name: str, answer_bytes: int
) -> None:
    scenario = SCENARIOS[name]
    with running(tmp_path) as stack:
        measure(stack, SCENARIOS["image"])  # warm up: imports, pools, the first receipt
        measure(stack, SCENARIOS["speech"])
        result = measure(stack, scenario)
    assert result["status"] == 200 and result["answer_bytes"] >= answer_bytes, result
    print(f"{name}: peak +{result['peak_above_mb']:.1f} MiB, {result['cpu_s'] * 1000:.0f} ms CPU")
    assert result["peak_x_payload"] <= 2.0, result
