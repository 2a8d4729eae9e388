"""The simulated worker's ``/metrics`` (TEST EQUIPMENT): the engine's sequence
families as mistral.rs >= 0.9.2 exports them (reference §12), with a
controllable confirmation of canceled streams (spec §20).

A stream whose client went away keeps counting as running for
``confirm_delay_s`` (None: forever), like a sequence the engine notices only
at its next token send; then it counts in
``mistralrs_sequences_completed_total{reason="canceled"}``. ``mode`` shapes
the answer: ``engine`` (the default), ``http_only`` (a 0.8.8-0.9.0 pin),
``404``, ``503`` (``--disable-metrics``), ``huge`` (a 20 MiB body) and
``slow`` (a head, then nothing for a minute).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.testing.simulator.plans import Head, Op, Step, simple_reply, text_reply

MODES = frozenset({"engine", "http_only", "404", "503", "huge", "slow"})
_HUGE_BYTES = 20 * 1024 * 1024


@dataclass
class EngineMetrics:
    mode: str = "engine"
    #: how long a canceled stream still counts as running (None: it never ends)
    confirm_delay_s: float | None = 0.0
    #: monotonic seconds at which each canceled stream ends in the engine
    pending: list[float] = field(default_factory=list)
    canceled_total: int = 0
    #: GET /metrics answered so far
    requests: int = 0

    def canceled(self, now: float) -> None:
        """A stream's client went away (called where the stream ends)."""
        if self.confirm_delay_s is None:
            self.pending.append(float("inf"))
        else:
            self.pending.append(now + self.confirm_delay_s)

    def _settle(self, now: float) -> None:
        due = [at for at in self.pending if at <= now]
        if due:
            self.pending = [at for at in self.pending if at > now]
            self.canceled_total += len(due)

    def exposition(self, active: int, now: float) -> str:
        self._settle(now)
        running = active + len(self.pending)
        return (
            "# mistralrs protocol simulator (test equipment)\n"
            "# HELP http_requests_total Total HTTP requests\n"
            "# TYPE http_requests_total counter\n"
            'http_requests_total{method="POST",path="/v1/chat/completions"} 1\n'
            "# TYPE mistralrs_sequences_running gauge\n"
            f"mistralrs_sequences_running {running}\n"
            "# TYPE mistralrs_sequences_waiting gauge\n"
            "mistralrs_sequences_waiting 0\n"
            "# TYPE mistralrs_sequences_completed_total counter\n"
            f'mistralrs_sequences_completed_total{{reason="canceled"}} {self.canceled_total}\n'
        )


def reply(metrics: EngineMetrics, active: int, request_id: str) -> Iterator[Step]:
    """The answer to ``GET /metrics`` (the caller holds the state's lock)."""
    metrics.requests += 1
    mode = metrics.mode
    if mode == "404":
        return text_reply(404, "Not Found", request_id)
    if mode == "503":
        return text_reply(503, "metrics are disabled", request_id)
    if mode == "http_only":
        text = "# TYPE http_requests_total counter\nhttp_requests_total 1\n"
        return text_reply(200, text, request_id)
    if mode == "huge":
        return simple_reply(200, b"#" * _HUGE_BYTES, request_id, "text/plain; version=0.0.4")
    if mode == "slow":
        headers = [("content-type", "text/plain; version=0.0.4"), ("x-request-id", request_id)]
        return iter([Head(200, headers, None), Op.HANG])
    text = metrics.exposition(active, time.monotonic())
    return text_reply(200, text, request_id)
