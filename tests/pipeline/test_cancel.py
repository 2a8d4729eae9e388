"""One request's cancel scope: what ends it, what is recorded, what a late
cancel does, and the disconnect watcher beside the work."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.pipeline.cancel import LAST_WORDS_S, CallerStalled, Exchange, watch_disconnect
from tests.support.poll import eventually_async


async def _forever() -> None:
    await asyncio.Event().wait()


class _Work:
    """Work that records how far it got; waits until released (or forever)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False
        self.cancelled = False

    async def __call__(self) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True


async def _started(ex: Exchange, work: _Work) -> asyncio.Task[bool]:
    task = asyncio.create_task(ex.run(work))
    async with asyncio.timeout(5):
        await work.started.wait()
    return task


async def test_run_returns_true_when_the_work_ends() -> None:
    ex, work = Exchange(), _Work()
    task = await _started(ex, work)
    assert ex.scope is not None
    work.release.set()
    async with asyncio.timeout(5):
        assert await task is True
    assert work.finished and ex.scope is None
    assert not (ex.disconnected or ex.shutdown or ex.stalled)


async def test_a_disconnect_cancels_the_work_and_run_says_so() -> None:
    ex, work = Exchange(), _Work()
    task = await _started(ex, work)
    ex.cancel()
    async with asyncio.timeout(5):
        assert await task is False
    assert work.cancelled and not work.finished
    assert ex.disconnected and not ex.shutdown
    assert ex.canceled_by_caller
    assert ex.scope is None


async def test_a_shutdown_cancel_is_recorded_apart_from_the_caller() -> None:
    ex, work = Exchange(), _Work()
    task = await _started(ex, work)
    ex.cancel(shutdown=True)
    async with asyncio.timeout(5):
        assert await task is False
    assert ex.shutdown and not ex.disconnected
    assert not ex.canceled_by_caller


async def test_a_second_cancel_while_the_first_is_pending_is_harmless() -> None:
    ex, work = Exchange(), _Work()
    task = await _started(ex, work)
    ex.cancel(shutdown=True)
    ex.cancel()
    async with asyncio.timeout(5):
        assert await task is False
    assert ex.shutdown and ex.disconnected


async def test_a_cancel_before_run_records_but_cancels_nothing() -> None:
    ex = Exchange()
    ex.cancel()
    assert ex.disconnected
    work = _Work()
    work.release.set()
    async with asyncio.timeout(5):
        assert await ex.run(work) is True
    assert work.finished


async def test_a_cancel_after_run_exited_does_nothing() -> None:
    ex, work = Exchange(), _Work()
    work.release.set()
    assert await ex.run(work) is True
    ex.cancel(shutdown=True)
    # The task that ran the scope is not cancelled later by a stale deadline.
    await asyncio.sleep(0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert ex.shutdown and ex.scope is None


async def test_a_timeout_error_the_scope_did_not_cause_propagates() -> None:
    ex = Exchange()

    async def buggy() -> None:
        raise TimeoutError("not the scope's")

    with pytest.raises(TimeoutError, match="not the scope's"):
        await ex.run(buggy)
    assert ex.scope is None


async def test_other_exceptions_propagate_and_clear_the_scope() -> None:
    ex = Exchange()

    async def failing() -> None:
        assert ex.scope is not None
        raise CallerStalled

    with pytest.raises(CallerStalled):
        await ex.run(failing)
    assert ex.scope is None


async def test_an_outside_cancel_of_the_task_is_not_swallowed() -> None:
    ex, work = Exchange(), _Work()
    task = await _started(ex, work)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert not ex.disconnected and not ex.shutdown


async def test_stall_records_and_drops_the_connection() -> None:
    dropped: list[str] = []
    ex = Exchange(abort=lambda: dropped.append("abort"))
    ex.stall()
    assert ex.stalled and ex.canceled_by_caller
    assert dropped == ["abort"]
    assert not ex.disconnected


async def test_drop_connection_without_a_listener_abort_is_a_no_op() -> None:
    ex = Exchange()
    ex.drop_connection()
    ex.stall()
    assert ex.stalled


async def test_drop_connection_calls_abort_each_time() -> None:
    calls: list[int] = []
    ex = Exchange(abort=lambda: calls.append(1))
    ex.drop_connection()
    ex.drop_connection()
    assert calls == [1, 1]
    assert not ex.stalled  # only stall() says why


async def test_each_exchange_has_its_own_done_event_and_identity() -> None:
    a, b = Exchange(), Exchange()
    assert not a.done.is_set()
    a.done.set()
    assert not b.done.is_set()
    # Identity, not field equality: two fresh exchanges are two entries of a set.
    assert len({a, b}) == 2 and a != b


def test_last_words_is_a_short_positive_bound() -> None:
    assert 0 < LAST_WORDS_S <= 5


# -- watch_disconnect ---------------------------------------------------------


class _Receive:
    def __init__(self, *messages: dict[str, Any]) -> None:
        self._messages = list(messages)
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if not self._messages:
            await _forever()
        return self._messages.pop(0)


async def test_watch_disconnect_cancels_on_http_disconnect() -> None:
    ex = Exchange()
    receive = _Receive({"type": "http.disconnect"})
    async with asyncio.timeout(5):
        await watch_disconnect(receive, ex)
    assert ex.disconnected and receive.calls == 1


async def test_watch_disconnect_skips_other_messages() -> None:
    ex = Exchange()
    receive = _Receive(
        {"type": "http.request", "body": b"late", "more_body": False},
        {"type": "http.request", "body": b"", "more_body": False},
        {"type": "http.disconnect"},
    )
    async with asyncio.timeout(5):
        await watch_disconnect(receive, ex)
    assert receive.calls == 3 and ex.disconnected


async def test_watch_disconnect_keeps_waiting_without_a_disconnect() -> None:
    ex = Exchange()
    receive = _Receive({"type": "http.request", "body": b"", "more_body": False})
    watcher = asyncio.create_task(watch_disconnect(receive, ex))
    await eventually_async(lambda: receive.calls == 2, "the watcher asked again")
    assert not watcher.done() and not ex.disconnected
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher


async def test_a_disconnect_beside_the_work_ends_the_run() -> None:
    ex, work = Exchange(), _Work()
    gate = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gate.wait()
        return {"type": "http.disconnect"}

    async def guarded() -> None:
        watcher = asyncio.create_task(watch_disconnect(receive, ex))
        try:
            await work()
        finally:
            watcher.cancel()

    task = asyncio.create_task(ex.run(guarded))
    async with asyncio.timeout(5):
        await work.started.wait()
    gate.set()
    async with asyncio.timeout(5):
        assert await task is False
    assert ex.disconnected and work.cancelled and ex.canceled_by_caller
