"""bench.budget's split: samples by the innermost frame naming a stage."""

from __future__ import annotations

from pathlib import Path

from bench.budget import LOOP, split, stage_of, table

_MAIN = "<module> (mistralrs-gateway:6);Runner.run (asyncio/runners.py:118)"


def test_a_sample_belongs_to_its_innermost_stage() -> None:
    frames = [
        "InferenceEndpoint._serve (gateway/http/inference.py:91)",
        "Relay._pump (gateway/pipeline/relay.py:162)",
        "ChunkGrammar._on_chunk (gateway/apis/chat/grammar.py:200)",
    ]
    assert stage_of(frames) == "relay per chunk"
    assert stage_of(frames[:1]) == "request pipeline"
    assert stage_of(["Runner.run (asyncio/runners.py:118)"]) == LOOP[0]


def test_other_threads_are_left_out_and_idle_samples_come_off_the_loop(tmp_path: Path) -> None:
    stacks = tmp_path / "latency.txt"
    stacks.write_text(
        f"{_MAIN} 50\n"  # the loop's C code, some of it idle
        "Relay._drain (gateway/pipeline/relay.py:201) 30\n"
        "Authenticator.authenticate (gateway/auth/__init__.py:130) 20\n"
        "Thread._bootstrap (threading.py:1002);ReceiptWriter._write_batch (x.py:1) 400\n"
    )
    counts = split(stacks, busy_samples=80)  # 100 main-thread samples, 80 busy
    assert counts["relay per chunk"] == 30 and counts["auth"] == 20
    assert counts[LOOP[0]] == 30  # 50 - the 20 idle ones
    assert "receipt (loop side)" not in counts
    text, met = table(counts, loop_us=800, threads_us=10)
    assert "relay per chunk" in text and "[MISS]" in text and not met
    assert "810.0" in text  # the total is the loop's and the threads' CPU
