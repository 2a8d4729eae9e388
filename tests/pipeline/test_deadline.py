"""The movable deadline behaves like ``asyncio.timeout_at`` with a cheap move."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.deadline import Deadline


async def _forever() -> None:
    await asyncio.Event().wait()


async def test_expires_as_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(start + 0.05) as deadline:
            await _forever()
    assert deadline.expired()
    assert loop.time() - start >= 0.049
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_moving_later_postpones_with_one_timer() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(start + 0.03) as deadline:
            for _ in range(1000):
                deadline.move_to(start + 0.12)
            await _forever()
    assert loop.time() - start >= 0.119


async def test_moving_earlier_rearms() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(start + 30) as deadline:
            deadline.move_to(start + 0.03)
            await _forever()
    assert loop.time() - start < 5


async def test_no_expiry_when_the_block_ends_in_time() -> None:
    loop = asyncio.get_running_loop()
    async with Deadline(loop.time() + 0.05) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired()
    # The timer is gone: waiting past the old deadline cancels nothing.
    await asyncio.sleep(0.08)


@pytest.mark.parametrize("racing", [False, True], ids=["alone", "racing-expiry"])
async def test_outside_cancel_is_not_turned_into_timeout(racing: bool) -> None:
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    when = loop.time() + (0.01 if racing else 30)

    async def body() -> None:
        async with Deadline(when):
            entered.set()
            await _forever()

    task = asyncio.create_task(body())
    await entered.wait()
    if racing:
        # The outside cancel is due at the same loop time as the deadline.
        loop.call_at(when, task.cancel)
    else:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_exception_inside_passes_through() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError):
        async with Deadline(loop.time() + 30):
            raise ValueError("boom")


async def test_expiry_is_taken_back_even_when_the_block_raises_something_else() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(ValueError):
        async with Deadline(loop.time() + 0.01):
            try:
                await _forever()
            except asyncio.CancelledError:
                raise ValueError("converted") from None
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_moving_after_exit_does_nothing() -> None:
    loop = asyncio.get_running_loop()
    async with Deadline(loop.time() + 30) as deadline:
        pass
    deadline.move_to(loop.time() + 0.01)  # earlier than armed: would re-arm if still entered
    await asyncio.sleep(0.05)  # not cancelled
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_first_check_before_when_still_expires_at_when() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(start + 0.12, first_check=start + 0.02):
            await _forever()
    assert loop.time() - start >= 0.119


async def test_a_move_to_past_the_first_check_needs_no_new_timer() -> None:
    # The relay's case: armed at the idle deadline, the first event moves it later.
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with Deadline(start + 1.0, first_check=start + 0.03) as deadline:
            armed = deadline._handle
            deadline.move_to(start + 0.08)
            assert deadline._handle is armed  # a float store
            await _forever()
    elapsed = loop.time() - start
    assert 0.079 <= elapsed < 0.5
