"""Events per second through the SSE validator on one core (json vs orjson).

Run: ``.venv/bin/python -m bench.bench_sse``. The stream is what the worker
sends for a long chat answer: keep-alives during prefill, one token-sized
chunk per event in the worker's exact byte format, mixed ASCII and
multi-byte text, the nine-field usage on the terminal chunk, ``[DONE]``.
Two feeding patterns bracket reality: one read per event (a live stream the
gateway keeps up with) and 64 KiB reads (a backlog drained at once). The
``relay`` rows are the whole per-chunk relay of a streamed chat: the chat
dialect's source and its caller frames (the gateway's id and alias), through
``apis.base.pump`` as the relay runs it. Which build ran (compiled or pure,
``gateway/native.py``) is the first line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway import native
from gateway.apis.base import DONE, Plan, StreamBounds, pump
from gateway.apis.chat.dialect import ChunkDialect, SSEValidator, StreamRules
from gateway.core.sse import NEED_DATA, Done
from tests.support.sse import chunk, event, usage

TOKENS = 4000
REPEATS = 5
WORDS = (" the", " model", " answer", " é", "té", " 日本", " 🙂", ",", " data", "\n")


def chat_stream(tokens: int = TOKENS) -> list[bytes]:
    """The stream as the list of its events' bytes."""
    terminal = usage(
        tokens,
        512,
        avg_tok_per_sec=55.2,
        avg_prompt_tok_per_sec=310.0,
        avg_compl_tok_per_sec=48.1,
        total_time_sec=72.9,
        total_prompt_time_sec=1.65,
        total_completion_time_sec=71.25,
    )
    events = [b":\n\n", b":\n\n"]
    events += [event(chunk(WORDS[i % len(WORDS)])) for i in range(tokens)]
    events += [event(chunk("", "stop", terminal)), b"data: [DONE]\n\n"]
    return events


def run_once(pieces: list[bytes], loads: Callable[[bytes | str], Any]) -> tuple[int, float]:
    validator = SSEValidator(StreamRules("chat", max_tokens=TOKENS, loads=loads))
    start = time.perf_counter()
    for piece in [*pieces, b""]:
        validator.receive_data(piece)
        while (event := validator.next_event()) is not NEED_DATA:
            if isinstance(event, Done):
                return validator.events, time.perf_counter() - start
    raise AssertionError("benchmark stream did not complete")


def relay_once(pieces: list[bytes]) -> tuple[int, float]:
    plan = Plan("chat.completions", "alias", {"messages": []}, True, False, TOKENS, 10, "n")
    dialect = ChunkDialect("chat", plan, StreamBounds(), collect=False)
    source = dialect.source
    start = time.perf_counter()
    for piece in [*pieces, b""]:
        source.receive_data(piece)
        out: list[bytes] = []
        if pump(dialect, out, True, False, None) & DONE:
            assert isinstance(source, SSEValidator)
            return source.events, time.perf_counter() - start
    raise AssertionError("benchmark stream did not complete")


def measure(pieces: list[bytes], loads: Callable[[bytes | str], Any] | None) -> float:
    """Best of REPEATS, in events per second (``loads`` None: the relay)."""
    best = 0.0
    for _ in range(REPEATS):
        events, elapsed = relay_once(pieces) if loads is None else run_once(pieces, loads)
        best = max(best, events / elapsed)
    return best


def main() -> None:
    events = chat_stream()
    blob = b"".join(events)
    reads = {
        "one read per event": events,
        "64 KiB reads": [blob[i : i + 65536] for i in range(0, len(blob), 65536)],
    }
    loaders: dict[str, Callable[[bytes | str], Any] | None] = {
        "json.loads": json.loads,
        "orjson.loads": orjson.loads,
        "relay": None,
    }
    print("build: {} ({})".format(*native.selected()))
    print(f"chat stream: {len(events)} events, {len(blob)} bytes, best of {REPEATS}")
    for read_name, pieces in reads.items():
        for loads_name, loads in loaders.items():
            rate = measure(pieces, loads)
            print(f"  {read_name:<20} {loads_name:<13} {rate:>10,.0f} events/s")


if __name__ == "__main__":
    main()
