"""A canceled request keeps its permits until its worker's metrics confirm it
stopped (spec §20): each rule of ``gateway/upstream/confirm.py``, against a
scripted ``fetch`` (no network) and, where time matters, a fake clock."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.upstream import confirm
from gateway.upstream.client import MetricsUnreadable, WorkerGone
from gateway.upstream.confirm import CancelConfirmer, Release, State
from tests.support.poll import eventually_async

#: the poll interval under test (the real one is 0.1 s)
FAST_POLL_S = 0.002
#: the longest any single wait in these tests may take
WAIT_S = 5.0


def exposition(running: int = 0, waiting: int = 0, canceled: int | None = 0) -> bytes:
    """mistral.rs's three sequence families (reference §12); ``canceled=None``:
    the counter vector exports its ``# TYPE`` line only."""
    text = (
        "# HELP http_requests_total Total HTTP requests\n"
        "# TYPE http_requests_total counter\n"
        'http_requests_total{method="POST",path="/v1/chat/completions"} 9\n'
        "# TYPE mistralrs_sequences_running gauge\n"
        f"mistralrs_sequences_running {running}\n"
        "# TYPE mistralrs_sequences_waiting gauge\n"
        f"mistralrs_sequences_waiting {waiting}\n"
        "# TYPE mistralrs_sequences_completed_total counter\n"
        'mistralrs_sequences_completed_total{reason="stop"} 100\n'
    )
    if canceled is not None:
        text += f'mistralrs_sequences_completed_total{{reason="canceled"}} {canceled}\n'
    return text.encode()


HTTP_ONLY = b"# TYPE http_requests_total counter\nhttp_requests_total 1\n"


class Worker:
    """The worker's ``/metrics`` as the confirmer sees it: the answer the test
    set last (or :class:`MetricsUnreadable`), optionally held at a gate."""

    def __init__(self) -> None:
        self.status = 200
        self.body = exposition()
        self.unreadable = False
        #: nothing listens at the worker's address
        self.gone = False
        self.calls = 0
        #: set: fetches answer at once; cleared: they wait for it
        self.gate = asyncio.Event()
        self.gate.set()
        #: fetches that reached the gate
        self.entered = 0
        #: monotonic seconds of each fetch
        self.times: list[float] = []

    def answer(self, running: int = 0, waiting: int = 0, canceled: int | None = 0) -> None:
        self.status, self.body, self.unreadable = 200, exposition(running, waiting, canceled), False

    async def fetch(self) -> tuple[int, bytes]:
        self.calls += 1
        self.times.append(time.monotonic())
        self.entered += 1
        await self.gate.wait()
        if self.gone:
            raise WorkerGone
        if self.unreadable:
            raise MetricsUnreadable
        return self.status, self.body


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Releases:
    """Every release call, in order, by request name."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, State]] = []

    def of(self, name: str) -> Release:
        def release(state: State) -> None:
            self.calls.append((name, state))

        return release

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


class Live:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def __call__(self) -> int:
        return self.value


@pytest.fixture(autouse=True)
def _fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confirm, "POLL_S", FAST_POLL_S)


@pytest.fixture
def worker() -> Worker:
    return Worker()


@pytest.fixture
def releases() -> Releases:
    return Releases()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def live() -> Live:
    return Live()


class Confirmers:
    """Builds confirmers and closes them after the test (no task outlives it)."""

    def __init__(self, worker: Worker, clock: Clock, live: Live) -> None:
        self.worker, self.clock, self.live = worker, clock, live
        self.made: list[CancelConfirmer] = []
        self.confirmed: list[float] = []
        self.unconfirmed = 0

    def __call__(self, *, timeout_s: float = 10.0, name: str = "w1") -> CancelConfirmer:
        def on_unconfirmed() -> None:
            self.unconfirmed += 1

        made = CancelConfirmer(
            name,
            self.worker.fetch,
            timeout_s=timeout_s,
            live=self.live,
            on_confirmed=self.confirmed.append,
            on_unconfirmed=on_unconfirmed,
            clock=self.clock,
        )
        self.made.append(made)
        return made


@pytest.fixture
async def make(worker: Worker, clock: Clock, live: Live) -> AsyncIterator[Confirmers]:
    confirmers = Confirmers(worker, clock, live)
    yield confirmers
    worker.gate.set()
    async with asyncio.timeout(WAIT_S):
        for made in confirmers.made:
            await made.aclose()


async def until(predicate: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WAIT_S + 1):
        await eventually_async(predicate, what, timeout_s=WAIT_S)


async def polls_pass(c: CancelConfirmer, n: int = 2) -> None:
    """At least one whole poll started (and ended) after this call: the answer
    set before it has been read."""
    target = c.polls + n
    await until(lambda: c.polls >= target, f"{n} more polls (at {c.polls})")


async def quiet(c: CancelConfirmer, intervals: int = 20) -> int:
    """The polls made over ``intervals`` poll intervals of nothing happening
    (a bounded look for the absence of polls, not a wait for a condition)."""
    before = c.polls
    await asyncio.sleep(intervals * FAST_POLL_S)
    return c.polls - before


def other_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


# -- an idle gateway never polls ---------------------------------------------------


async def test_nothing_held_means_no_fetch_at_all(make: Confirmers, worker: Worker) -> None:
    c = make()
    assert await quiet(c, 30) == 0
    assert c.polls == 0 and worker.calls == 0 and c.held == 0
    assert other_tasks() == []


async def test_polling_starts_on_hold_and_stops_when_nothing_is_held(
    make: Confirmers, worker: Worker, releases: Releases, live: Live
) -> None:
    worker.answer(running=5, canceled=0)
    c = make()
    c.hold(releases.of("a"))
    assert c.held == 1
    await polls_pass(c, 3)
    assert releases.calls == []  # running 5 > live 0, no rise: still held
    live.value = 5
    await until(lambda: releases.calls == [("a", "worker_confirmed")], "a confirmed")
    assert c.held == 0
    polls = c.polls
    assert await quiet(c) == 0
    assert c.polls == polls == worker.calls
    assert other_tasks() == []
    # A new hold starts a new poll.
    c.hold(releases.of("b"))
    await until(lambda: ("b", "worker_confirmed") in releases.calls, "b confirmed")
    assert c.polls == polls + 1
    assert await quiet(c) == 0


async def test_polls_are_spaced_by_the_poll_interval(
    make: Confirmers, worker: Worker, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confirm, "POLL_S", 0.03)
    worker.answer(running=1)
    c = make()
    c.hold(releases.of("a"))
    await asyncio.sleep(0)  # one turn of the loop: the poll task's first step
    assert c.polls == 1  # the first poll is at once, not POLL_S later
    await until(lambda: c.polls >= 3, "three polls")
    gaps = [b - a for a, b in zip(worker.times, worker.times[1:], strict=False)]
    assert len(gaps) >= 2 and all(gap >= 0.029 for gap in gaps)


async def test_the_poll_ends_with_the_last_hold_not_an_interval_later(
    make: Confirmers, worker: Worker, releases: Releases, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confirm, "POLL_S", 30.0)
    worker.answer(running=0)
    c = make()
    c.hold(releases.of("a"))
    await until(lambda: c.held == 0, "a confirmed")
    async with asyncio.timeout(WAIT_S):
        await eventually_async(lambda: other_tasks() == [], "the poll ended", timeout_s=1.0)
    assert releases.calls == [("a", "worker_confirmed")] and c.polls == 1


# -- each rise of the canceled counter confirms one held request, oldest first --


async def test_each_rise_confirms_one_held_request_oldest_first(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=10)
    c = make()
    for name in ("a", "b", "c", "d"):
        c.hold(releases.of(name))
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 4  # 10 is the value seen at the cancel

    worker.answer(running=8, canceled=11)
    await until(lambda: len(releases.calls) == 1, "one confirmed")
    await polls_pass(c)
    assert releases.calls == [("a", "worker_confirmed")] and c.held == 3

    worker.answer(running=8, canceled=13)  # two rises: two more
    await until(lambda: len(releases.calls) == 3, "three confirmed")
    await polls_pass(c)
    assert releases.calls == [
        ("a", "worker_confirmed"),
        ("b", "worker_confirmed"),
        ("c", "worker_confirmed"),
    ]
    assert c.held == 1

    worker.answer(running=8, canceled=20)  # more rises than held: the rest
    await until(lambda: c.held == 0, "all confirmed")
    assert releases.names() == ["a", "b", "c", "d"]
    assert {state for _, state in releases.calls} == {"worker_confirmed"}


async def test_a_request_held_later_waits_for_a_rise_past_the_value_then(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=3)
    c = make()
    c.hold(releases.of("old"))
    await polls_pass(c)
    worker.answer(running=8, canceled=4)
    await until(lambda: releases.names() == ["old"], "old confirmed")
    # Polling stopped with nothing held; the next hold starts from the current value.
    c.hold(releases.of("new"))
    await polls_pass(c, 3)
    assert releases.names() == ["old"] and c.held == 1
    worker.answer(running=8, canceled=5)
    await until(lambda: releases.names() == ["old", "new"], "new confirmed")


async def test_a_rise_while_one_is_held_does_not_confirm_one_held_after_it(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=0)
    c = make()
    c.hold(releases.of("a"))
    await polls_pass(c)
    c.hold(releases.of("b"))
    await polls_pass(c)
    worker.answer(running=8, canceled=1)
    await until(lambda: len(releases.calls) == 1, "one confirmed")
    await polls_pass(c, 3)
    assert releases.calls == [("a", "worker_confirmed")] and c.held == 1
    worker.answer(running=8, canceled=2)
    await until(lambda: c.held == 0, "b confirmed")
    assert releases.names() == ["a", "b"]


async def test_a_counter_that_goes_down_confirms_nothing_then_counts_from_there(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=50)
    c = make()
    c.hold(releases.of("a"))
    await polls_pass(c)
    worker.answer(running=8, canceled=0)  # the worker restarted
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 1
    worker.answer(running=8, canceled=1)
    await until(lambda: releases.calls == [("a", "worker_confirmed")], "a confirmed")


async def test_a_canceled_series_appearing_counts_as_a_rise_from_zero(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=None)  # # TYPE line only: 0
    c = make()
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await polls_pass(c, 3)
    assert releases.calls == []
    worker.answer(running=8, canceled=1)
    await until(lambda: releases.calls == [("a", "worker_confirmed")], "a confirmed")
    await polls_pass(c)
    assert c.held == 1


# -- running + waiting at most the live requests confirms every held one ----------


async def test_running_plus_waiting_at_most_live_confirms_all(
    make: Confirmers, worker: Worker, releases: Releases, live: Live
) -> None:
    worker.answer(running=2, waiting=2, canceled=7)
    live.value = 3
    c = make()
    for name in ("a", "b", "c"):
        c.hold(releases.of(name))
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 3  # 4 > 3: the worker runs one of them
    live.value = 4  # equal: at most
    await until(lambda: c.held == 0, "all confirmed")
    assert releases.calls == [
        ("a", "worker_confirmed"),
        ("b", "worker_confirmed"),
        ("c", "worker_confirmed"),
    ]


async def test_an_idle_worker_confirms_all_on_the_first_poll(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=0, waiting=0, canceled=0)
    c = make()
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await until(lambda: c.held == 0, "all confirmed")
    assert c.polls == 1
    assert releases.calls == [("a", "worker_confirmed"), ("b", "worker_confirmed")]


async def test_waiting_counts_like_running(
    make: Confirmers, worker: Worker, releases: Releases, live: Live
) -> None:
    worker.answer(running=0, waiting=2)
    live.value = 1
    c = make()
    c.hold(releases.of("a"))
    await polls_pass(c, 3)
    assert c.held == 1
    worker.answer(running=0, waiting=1)
    await until(lambda: c.held == 0, "a confirmed")
    assert releases.calls == [("a", "worker_confirmed")]


# -- an unreadable answer confirms nothing; the hold ends at timeout_s -----------


async def test_unreadable_answers_hold_until_the_timeout(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock
) -> None:
    worker.unreadable = True
    c = make(timeout_s=10.0)
    c.hold(releases.of("a"))  # at 1000
    clock.now = 1005.0
    c.hold(releases.of("b"))  # at 1005
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 2

    clock.now = 1009.999
    await polls_pass(c)
    assert releases.calls == []

    clock.now = 1010.0  # a has been held 10 s
    await until(lambda: len(releases.calls) == 1, "a timed out")
    await polls_pass(c)
    assert releases.calls == [("a", "confirm_timeout")] and c.held == 1
    assert make.unconfirmed == 1

    clock.now = 1015.0
    await until(lambda: c.held == 0, "b timed out")
    assert releases.calls == [("a", "confirm_timeout"), ("b", "confirm_timeout")]
    assert make.unconfirmed == 2
    assert make.confirmed == []
    assert await quiet(c) == 0


async def test_a_worker_that_refuses_the_connection_holds_nothing(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    """Its process is gone, and with it every sequence it ran."""
    worker.gone = True
    c = make(timeout_s=10.0)
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await until(lambda: c.held == 0, "both released")
    assert releases.calls == [("a", "unconfirmable"), ("b", "unconfirmable")]
    assert make.unconfirmed == 0 and make.confirmed == []


async def test_unreadable_answers_confirm_nothing_even_after_a_readable_one(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock
) -> None:
    worker.answer(running=8, canceled=1)
    c = make(timeout_s=10.0)
    c.hold(releases.of("a"))
    await polls_pass(c)
    worker.unreadable = True
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 1
    worker.answer(running=8, canceled=2)  # readable again: the rise counts
    await until(lambda: releases.calls == [("a", "worker_confirmed")], "a confirmed")
    assert make.unconfirmed == 0


@pytest.mark.parametrize("status", [500, 502, 429])
async def test_an_error_status_is_unreadable_not_unconfirmable(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock, status: int
) -> None:
    worker.status, worker.body = status, b"oops"
    c = make(timeout_s=10.0)
    c.hold(releases.of("a"))
    await polls_pass(c, 3)
    assert releases.calls == [] and c.held == 1
    clock.now += 10.0
    await until(lambda: releases.calls == [("a", "confirm_timeout")], "a timed out")
    assert make.unconfirmed == 1


async def test_a_readable_answer_without_confirmation_still_times_out(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock
) -> None:
    worker.answer(running=8, canceled=4)
    c = make(timeout_s=2.0)
    c.hold(releases.of("a"))
    await polls_pass(c, 3)
    assert c.held == 1
    clock.now += 2.0
    await until(lambda: releases.calls == [("a", "confirm_timeout")], "a timed out")
    assert make.unconfirmed == 1 and make.confirmed == []


# -- a worker without the metrics cannot confirm: no hold, logged once -----------


@pytest.mark.parametrize(
    ("status", "body"),
    [(404, b"Not Found"), (503, b"metrics disabled"), (200, HTTP_ONLY), (200, b"")],
    ids=["404", "503", "http_only", "empty"],
)
async def test_a_worker_without_the_metrics_releases_at_once(
    make: Confirmers, worker: Worker, releases: Releases, status: int, body: bytes
) -> None:
    worker.status, worker.body = status, body
    c = make()
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await until(lambda: c.held == 0, "released")
    assert c.polls == 1  # at the first answer, no waiting for the timeout
    assert releases.calls == [("a", "unconfirmable"), ("b", "unconfirmable")]
    assert make.unconfirmed == 0 and make.confirmed == []
    assert await quiet(c) == 0


def _warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "gateway.cancel" and r.levelno == logging.WARNING and name in r.getMessage()
    ]


async def test_cannot_confirm_is_logged_once_per_worker_until_the_metrics_appear(
    make: Confirmers, worker: Worker, releases: Releases, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.cancel")
    worker.status, worker.body = 404, b"Not Found"
    c = make(name="w-a")
    for i in range(3):
        c.hold(releases.of(f"r{i}"))
        await until(lambda: c.held == 0, f"r{i} released")
    assert [s for _, s in releases.calls] == ["unconfirmable"] * 3
    assert len(_warnings(caplog, "w-a")) == 1
    assert "404" in _warnings(caplog, "w-a")[0].getMessage()

    # Another worker without metrics warns for itself.
    other = make(name="w-b")
    other.hold(releases.of("x"))
    await until(lambda: other.held == 0, "x released")
    assert len(_warnings(caplog, "w-b")) == 1
    assert len(_warnings(caplog, "w-a")) == 1

    # The metrics appear: said once, confirmations work again.
    worker.answer()
    c.hold(releases.of("r3"))
    await until(lambda: c.held == 0, "r3 confirmed")
    assert releases.calls[-1] == ("r3", "worker_confirmed")
    appeared = [
        r
        for r in caplog.records
        if r.name == "gateway.cancel" and r.levelno == logging.INFO and "w-a" in r.getMessage()
    ]
    assert len(appeared) == 1
    c.hold(releases.of("r4"))
    await until(lambda: c.held == 0, "r4 confirmed")
    infos = [r for r in caplog.records if r.name == "gateway.cancel" and r.levelno == logging.INFO]
    assert len(infos) == 1

    # They vanish again (an older pin, http_* only): warned again, once.
    worker.status, worker.body = 200, HTTP_ONLY
    for i in (5, 6):
        c.hold(releases.of(f"r{i}"))
        await until(lambda: c.held == 0, f"r{i} released")
    assert releases.calls[-2:] == [("r5", "unconfirmable"), ("r6", "unconfirmable")]
    warned = _warnings(caplog, "w-a")
    assert len(warned) == 2
    assert "no sequence metrics" in warned[1].getMessage()


# -- every release runs exactly once ---------------------------------------------


async def test_release_all_during_a_fetch_releases_once(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=0)  # this answer would confirm everything
    worker.gate.clear()
    c = make()
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await until(lambda: worker.entered == 1, "a fetch in flight")
    c.release_all()
    assert releases.calls == [("a", "confirm_timeout"), ("b", "confirm_timeout")]
    assert c.held == 0
    worker.gate.set()
    await until(lambda: other_tasks() == [], "the poll ended")
    assert releases.calls == [("a", "confirm_timeout"), ("b", "confirm_timeout")]
    assert make.unconfirmed == 2 and make.confirmed == []


async def test_release_all_as_the_fetch_answers_releases_once(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=0)
    worker.gate.clear()
    c = make()
    c.hold(releases.of("a"))
    await until(lambda: worker.entered == 1, "a fetch in flight")
    worker.gate.set()  # the answer is ready; the poll has not read it yet
    c.release_all("unconfirmable")
    await until(lambda: other_tasks() == [], "the poll ended")
    assert releases.calls == [("a", "unconfirmable")]
    assert make.unconfirmed == 0  # not a timeout


async def test_release_all_between_polls_releases_once(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=0)
    c = make()
    c.hold(releases.of("a"))
    await polls_pass(c)
    c.release_all()
    worker.answer(running=0, canceled=5)
    await until(lambda: other_tasks() == [], "the poll ended")
    assert await quiet(c) == 0
    assert releases.calls == [("a", "confirm_timeout")]


async def test_release_all_with_nothing_held_does_nothing(
    make: Confirmers, releases: Releases
) -> None:
    c = make()
    c.release_all()
    assert releases.calls == [] and c.polls == 0 and make.unconfirmed == 0


async def test_no_release_runs_twice_whatever_ends_the_holds(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock, live: Live
) -> None:
    """Confirmed, then timed out, then release_all and aclose: each release once."""
    worker.answer(running=8, canceled=0)
    c = make(timeout_s=5.0)
    for name in ("a", "b", "c", "d"):
        c.hold(releases.of(name))
    await polls_pass(c)
    worker.answer(running=8, canceled=1)  # a
    await until(lambda: len(releases.calls) == 1, "a confirmed")
    clock.now += 5.0  # b, c, d time out
    worker.unreadable = True
    await until(lambda: c.held == 0, "the rest timed out")
    c.release_all()
    await c.aclose()
    live.value = 100
    worker.answer(running=0, canceled=9)
    assert await quiet(c) == 0
    assert sorted(releases.names()) == ["a", "b", "c", "d"]
    assert releases.calls[0] == ("a", "worker_confirmed")
    assert {s for _, s in releases.calls[1:]} == {"confirm_timeout"}


# -- aclose ------------------------------------------------------------------------


async def test_aclose_releases_everything_and_leaves_no_task(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8, canceled=0)
    c = make()
    c.hold(releases.of("a"))
    c.hold(releases.of("b"))
    await polls_pass(c)
    assert other_tasks() != []  # the poll is running
    async with asyncio.timeout(WAIT_S):
        await c.aclose()
    assert releases.calls == [("a", "confirm_timeout"), ("b", "confirm_timeout")]
    assert c.held == 0
    assert other_tasks() == []
    assert await quiet(c) == 0


async def test_aclose_during_a_fetch_leaves_no_task(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.gate.clear()
    c = make()
    c.hold(releases.of("a"))
    await until(lambda: worker.entered == 1, "a fetch in flight")
    async with asyncio.timeout(WAIT_S):
        await c.aclose()
    assert releases.calls == [("a", "confirm_timeout")]
    assert other_tasks() == []
    worker.gate.set()
    assert await quiet(c) == 0
    assert releases.calls == [("a", "confirm_timeout")]


async def test_aclose_right_after_hold_releases_it(make: Confirmers, releases: Releases) -> None:
    c = make()
    c.hold(releases.of("a"))  # the poll has not started yet
    async with asyncio.timeout(WAIT_S):
        await c.aclose()
    assert releases.calls == [("a", "confirm_timeout")]
    assert other_tasks() == []


async def test_aclose_with_nothing_held(make: Confirmers, releases: Releases) -> None:
    c = make()
    async with asyncio.timeout(WAIT_S):
        await c.aclose()
    assert releases.calls == [] and c.polls == 0 and other_tasks() == []


async def test_a_hold_after_aclose_is_still_confirmed(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    c = make()
    c.hold(releases.of("a"))
    async with asyncio.timeout(WAIT_S):
        await c.aclose()
    worker.answer(running=0)
    c.hold(releases.of("b"))
    await until(lambda: c.held == 0, "b released")
    assert releases.names() == ["a", "b"]
    assert await quiet(c) == 0


# -- on_confirmed: how long the hold lasted --------------------------------------


async def test_on_confirmed_receives_the_held_duration(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock, live: Live
) -> None:
    worker.answer(running=8, canceled=0)
    c = make(timeout_s=60.0)
    clock.now = 100.0
    c.hold(releases.of("a"))
    clock.now = 101.5
    c.hold(releases.of("b"))
    await polls_pass(c)
    clock.now = 102.25
    worker.answer(running=8, canceled=1)
    await until(lambda: len(make.confirmed) == 1, "a confirmed")
    assert make.confirmed == [pytest.approx(2.25)]
    clock.now = 104.0
    live.value = 8
    await until(lambda: c.held == 0, "b confirmed")
    assert make.confirmed == [pytest.approx(2.25), pytest.approx(2.5)]
    assert releases.calls == [("a", "worker_confirmed"), ("b", "worker_confirmed")]
    assert make.unconfirmed == 0


async def test_works_without_callbacks_and_with_the_real_clock(
    worker: Worker, releases: Releases
) -> None:
    c = CancelConfirmer("plain", worker.fetch, timeout_s=0.05, live=lambda: 0)
    try:
        worker.unreadable = True
        started = time.monotonic()
        c.hold(releases.of("a"))
        await until(lambda: c.held == 0, "a timed out on the monotonic clock")
        assert time.monotonic() - started >= 0.05
        assert releases.calls == [("a", "confirm_timeout")]
        worker.answer()
        c.hold(releases.of("b"))
        await until(lambda: c.held == 0, "b confirmed")
        assert releases.calls[-1] == ("b", "worker_confirmed")
    finally:
        async with asyncio.timeout(WAIT_S):
            await c.aclose()


# -- known defects (spec §20 "every release runs exactly once"; a hold always ends) --


async def test_a_hold_after_release_all_of_an_unstarted_poll_is_polled(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    c = make()
    c.hold(releases.of("a"))
    c.release_all()  # before the poll task ran once
    assert releases.calls == [("a", "confirm_timeout")]
    await until(lambda: other_tasks() == [], "the canceled poll is gone")
    worker.answer(running=0)
    c.hold(releases.of("b"))
    async with asyncio.timeout(WAIT_S):
        await eventually_async(lambda: c.held == 0, "b confirmed", timeout_s=0.5)


async def test_a_hold_right_after_release_all_between_polls_is_polled(
    make: Confirmers, worker: Worker, releases: Releases
) -> None:
    worker.answer(running=8)
    c = make()
    c.hold(releases.of("a"))
    await polls_pass(c)
    c.release_all()
    c.hold(releases.of("b"))
    worker.answer(running=0)
    async with asyncio.timeout(WAIT_S):
        await eventually_async(lambda: c.held == 0, "b confirmed", timeout_s=0.5)


async def test_an_infinite_canceled_count_still_ends_the_hold(
    make: Confirmers, worker: Worker, releases: Releases, clock: Clock
) -> None:
    worker.answer(running=8, canceled=1)
    c = make(timeout_s=1.0)
    c.hold(releases.of("a"))
    await polls_pass(c)
    worker.body = worker.body.replace(b'{reason="canceled"} 1', b'{reason="canceled"} +Inf')
    assert b"+Inf" in worker.body
    clock.now += 1.0
    async with asyncio.timeout(WAIT_S):
        await eventually_async(lambda: c.held == 0, "a released", timeout_s=0.5)
