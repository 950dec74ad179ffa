"""The phase budget: free when a phase never waits, enforced when it does."""

from __future__ import annotations

import asyncio

import pytest

from gateway.extproc._budget import within


async def _sync_result() -> int:
    return 7


async def _waits(seconds: float, value: int) -> int:
    await asyncio.sleep(seconds)
    await asyncio.sleep(0)
    return value


async def _raises_after_wait() -> int:
    await asyncio.sleep(0)
    raise ValueError("x")


async def test_result_without_suspension() -> None:
    assert await within(0.01, _sync_result()) == 7


async def test_result_after_waiting_within_budget() -> None:
    assert await within(1.0, _waits(0.01, 3)) == 3


async def test_timeout_when_waiting_too_long() -> None:
    with pytest.raises(TimeoutError):
        await within(0.05, _waits(5, 1))


async def test_exceptions_propagate_after_a_wait() -> None:
    with pytest.raises(ValueError, match="x"):
        await within(1.0, _raises_after_wait())


async def test_cancellation_reaches_the_coroutine() -> None:
    cancelled = asyncio.Event()

    async def long() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(within(20, long()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
