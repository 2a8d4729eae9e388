"""An open-loop load generator: requests start on a fixed schedule, whatever the server does.

Theory of operation: :func:`arrivals` draws the run's start times up front
(Poisson: exponential gaps at the rate; uniform: evenly spaced), bounded
in count. :func:`run_open_loop` starts each request at its time on a
kept-alive HTTP/1.1 connection from a pool (the closed-loop client's
:class:`~bench.loadgen._Conn`, one request at a time per connection): an
idle one, else a new one up to ``max_connections``, else the first one
freed. A slow server therefore does not slow the schedule down: requests
pile up on more connections, as callers' requests would.

Every latency is measured **from the scheduled start**, not from when the
request was written: time spent waiting for a connection, or behind a
scheduler that fell behind, counts against the server, so the figures are
free of coordinated omission (a closed-loop client only sends when the
last answer came, and so never measures the queue a stall builds). The
generator's own lateness -- scheduled start to request written -- is
reported apart (``start_lag``), so a run where the generator could not
keep up shows it.

Bounded: the schedule has at most ``2 * rate * duration + 16`` starts, no
start is made past ``budget_s``, each request has ``request_timeout_s``,
and the run waits for stragglers at most that long. Only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.loadgen import NOT_SENT, Result, _Conn, _connect, close_connections


@dataclass(frozen=True, slots=True)
class Request:
    """One request's bytes and how its answer is recognised."""

    payload: bytes
    first_content: re.Pattern[bytes]
    done_tail: bytes
    streamed: bool


@dataclass(slots=True)
class Sample:
    #: seconds from the run's start
    scheduled_s: float
    streamed: bool
    result: Result
    #: scheduled start -> request written (the generator's and the pool's lateness)
    start_lag_s: float = 0.0
    #: scheduled start -> the answer's last byte (None when it failed)
    latency_s: float | None = None
    #: scheduled start -> the first content event (None when not seen)
    ttft_s: float | None = None


@dataclass
class OpenLoopResult:
    rate: float
    duration_s: float
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    connections: int = 0

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.result.error is None]

    def errors(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.samples:
            if s.result.error is not None:
                counts[s.result.error] = counts.get(s.result.error, 0) + 1
        return counts


def arrivals(
    rate: float, duration_s: float, *, process: str = "poisson", seed: int = 0
) -> list[float]:
    """Start times (seconds from the run's start) of an open-loop run."""
    if rate <= 0 or duration_s <= 0:
        return []
    limit = int(2 * rate * duration_s) + 16
    if process == "uniform":
        return [i / rate for i in range(min(limit, int(rate * duration_s)))]
    if process != "poisson":
        raise ValueError(f"unknown arrival process {process!r}")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while len(out) < limit:
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        out.append(t)
    return out


class _Pool:
    """Kept-alive connections: idle ones reused, new ones opened up to ``limit``,
    else the next one freed is handed to the longest waiter."""

    def __init__(self, port: int, limit: int) -> None:
        self.port = port
        self.limit = limit
        self.idle: list[_Conn] = []
        self.all: list[_Conn] = []
        self.opening = 0
        self.waiters: deque[asyncio.Future[_Conn | None]] = deque()

    @property
    def size(self) -> int:
        return sum(1 for c in self.all if not c.closed) + self.opening

    async def fill(self, count: int) -> None:
        conns = await asyncio.gather(*(_connect(self.port) for _ in range(min(count, self.limit))))
        self.all += conns
        self.idle += conns

    async def get(self) -> _Conn:
        for _ in range(3):  # a connection handed over closed is replaced; bounded
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
            if self.size < self.limit:
                self.opening += 1
                try:
                    conn = await asyncio.wait_for(_connect(self.port), 5)
                finally:
                    self.opening -= 1
                self.all.append(conn)
                return conn
            waiter: asyncio.Future[_Conn | None] = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            handed = await waiter
            if handed is not None and not handed.closed:
                return handed
        raise OSError("no connection")

    def put(self, conn: _Conn) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                # A closed one still wakes a waiter: it may open a new one now.
                waiter.set_result(None if conn.closed else conn)
                return
        if not conn.closed:
            self.idle.append(conn)

    def close(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.cancel()
        close_connections(self.all)


async def run_open_loop(
    port: int,
    request_for: Callable[[int], Request],
    schedule: list[float],
    *,
    rate: float,
    duration_s: float,
    request_timeout_s: float = 10.0,
    budget_s: float = 60.0,
    max_connections: int = 1024,
    prefill: int = 16,
) -> OpenLoopResult:
    """Start request ``i`` at ``schedule[i]`` seconds (open loop); every
    latency from its scheduled start."""
    out = OpenLoopResult(rate=rate, duration_s=duration_s)
    pool = _Pool(port, max_connections)
    await pool.fill(prefill)
    pending: set[asyncio.Task[None]] = set()

    async def one(index: int, due: float, offset: float) -> None:
        request = request_for(index)
        sample = Sample(offset, request.streamed, Result())
        out.samples.append(sample)
        try:
            conn = await asyncio.wait_for(pool.get(), request_timeout_s)
        except (OSError, TimeoutError):
            sample.result = Result(error="no connection")
            return
        waiter = conn.request(request.payload, request.first_content, request.done_tail)
        sent_at = conn.sent_at
        remaining = max(0.001, request_timeout_s - (time.perf_counter() - due))
        try:
            result = await asyncio.wait_for(asyncio.shield(waiter), remaining)
        except TimeoutError:
            conn._fail("timeout")
            result = waiter.result()
        pool.put(conn)
        sample.result = result
        sample.start_lag_s = sent_at - due
        if result.error is None:
            sample.latency_s = sent_at + result.duration_s - due
            if result.ttft_s is not None:
                sample.ttft_s = sent_at + result.ttft_s - due

    loop_start = time.perf_counter() + 0.01
    stop_at = loop_start + budget_s
    try:
        for index, offset in enumerate(schedule):
            due = loop_start + offset
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() > stop_at:
                out.samples += [Sample(o, False, Result(error=NOT_SENT)) for o in schedule[index:]]
                break
            task = asyncio.ensure_future(one(index, due, offset))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            # Every request has its own timeout; this bound only guards against a bug.
            await asyncio.wait(set(pending), timeout=request_timeout_s + 5)
    finally:
        for task in pending:
            task.cancel()
        out.wall_s = time.perf_counter() - loop_start
        out.connections = len(pool.all)
        pool.close()
    return out
