"""Releases (spec §18), the pure part: which arm a cohort gets, and the gate.

- :func:`canary_share` is the spec's assignment hash: the first 8 bytes of
  ``sha256("<release>\\n<cohort key>")`` big-endian, mod 10,000. A cohort is
  canary when its share is below ``percent x 100``, so raising the percent
  only ever moves stable cohorts to the canary (monotone), and the same key
  keeps its arm while the percent stands.
- :class:`ArmWindow` keeps one arm's recent requests, failures and TTFTs in
  time buckets (``BUCKETS`` per window) with a fixed log-spaced TTFT
  histogram per bucket, and their sums: recording is O(1), judging is
  O(buckets + bins), independent of the traffic. The p95 is the upper edge of
  the bin holding the 95th percentile (within one bin's ratio, :data:`BIN_RATIO`).
- :func:`judge` compares the arms as the gate says: a verdict only once both
  arms have ``min_requests`` in the window.

No clock is read here: callers pass ``now`` (monotonic seconds).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

#: assignment resolution: percent x 100 of these buckets go to the canary
SHARES = 10_000
#: time buckets per gate window
BUCKETS = 10
#: TTFT histogram: bins from 1 ms up, each BIN_RATIO times the one before
BIN_RATIO = 1.25
BIN_FLOOR_S = 0.001
BINS = 64


def canary_share(release: str, cohort_key: str) -> int:
    digest = hashlib.sha256(f"{release}\n{cohort_key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SHARES


def is_canary(release: str, cohort_key: str, percent: float) -> bool:
    return canary_share(release, cohort_key) < round(percent * 100)


def _bin(ttft_s: float) -> int:
    if ttft_s <= BIN_FLOOR_S:
        return 0
    return min(BINS - 1, 1 + int(math.log(ttft_s / BIN_FLOOR_S, BIN_RATIO)))


def _bin_upper_s(index: int) -> float:
    return BIN_FLOOR_S * BIN_RATIO**index


class ArmWindow:
    """One arm's requests, failures and TTFTs over the last ``window_s``.

    Besides the buckets it keeps their sums, so that :meth:`figures` costs
    O(buckets + bins) rather than O(buckets x bins): the gate judges on every
    finished request of its release (spec §24), not on a timer. A bucket
    leaves the sums when it leaves the window (or is reused)."""

    def __init__(self, window_s: float) -> None:
        self._width = window_s / BUCKETS
        self._epochs = [-1] * BUCKETS
        self._requests = [0] * BUCKETS
        self._failures = [0] * BUCKETS
        self._ttfts = [[0] * BINS for _ in range(BUCKETS)]
        #: the sums over every bucket still held (each with an epoch, none cleared)
        self._sum_requests = 0
        self._sum_failures = 0
        self._sum_ttfts = [0] * BINS

    def _clear(self, slot: int) -> None:
        self._sum_requests -= self._requests[slot]
        self._sum_failures -= self._failures[slot]
        sums = self._sum_ttfts
        for index, count in enumerate(self._ttfts[slot]):
            if count:
                sums[index] -= count
        self._epochs[slot] = -1
        self._requests[slot] = self._failures[slot] = 0
        self._ttfts[slot] = [0] * BINS

    def _slot(self, now: float) -> int:
        epoch = int(now / self._width)
        slot = epoch % BUCKETS
        if self._epochs[slot] != epoch:
            # A bucket a window old: its counts leave the window.
            self._clear(slot)
            self._epochs[slot] = epoch
        return slot

    def record(self, now: float, failed: bool, ttft_s: float | None) -> None:
        slot = self._slot(now)
        self._requests[slot] += 1
        self._sum_requests += 1
        if failed:
            self._failures[slot] += 1
            self._sum_failures += 1
        if ttft_s is not None:
            index = _bin(ttft_s)
            self._ttfts[slot][index] += 1
            self._sum_ttfts[index] += 1

    def _held_within(self, now: float) -> bool:
        """Drop the buckets the window left behind by ``now``; whether every
        bucket still held is within it (else ``now`` is before the newest record)."""
        epoch = int(now / self._width)
        within = True
        for slot, held in enumerate(self._epochs):
            if held == -1:
                continue
            if held <= epoch - BUCKETS:
                self._clear(slot)
            elif held > epoch:
                within = False
        return within

    def requests(self, now: float) -> int:
        """Requests within the window: what the gate checks first, cheaply."""
        if self._held_within(now):
            return self._sum_requests
        return self.figures(now).requests

    def figures(self, now: float) -> Figures:
        if self._held_within(now):
            return Figures(self._sum_requests, self._sum_failures, _p95(self._sum_ttfts))
        # ``now`` before a record (a clock set back): count the live buckets only.
        epoch = int(now / self._width)
        live = [i for i in range(BUCKETS) if epoch - BUCKETS < self._epochs[i] <= epoch]
        requests = sum(self._requests[i] for i in live)
        failures = sum(self._failures[i] for i in live)
        counts = [sum(self._ttfts[i][b] for i in live) for b in range(BINS)]
        return Figures(requests, failures, _p95(counts))


def _p95(counts: list[int]) -> float | None:
    total = sum(counts)
    if not total:
        return None
    rank = math.ceil(0.95 * total)
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return _bin_upper_s(index)
    return _bin_upper_s(BINS - 1)


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    failures: int
    ttft_p95_s: float | None

    @property
    def failure_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "failures": self.failures,
            "ttft_p95_ms": None if self.ttft_p95_s is None else round(self.ttft_p95_s * 1000, 1),
        }


@dataclass(frozen=True, slots=True)
class GateRule:
    min_requests: int
    max_failure_rate_delta: float
    max_ttft_p95_ratio: float


def judge(rule: GateRule, stable: Figures, canary: Figures) -> str | None:
    """Why the canary fails the gate (``"failure_rate"`` or ``"ttft_p95"``), or None."""
    if stable.requests < rule.min_requests or canary.requests < rule.min_requests:
        return None
    if canary.failure_rate - stable.failure_rate > rule.max_failure_rate_delta:
        return "failure_rate"
    if (
        canary.ttft_p95_s is not None
        and stable.ttft_p95_s is not None
        and canary.ttft_p95_s > rule.max_ttft_p95_ratio * stable.ttft_p95_s
    ):
        return "ttft_p95"
    return None
