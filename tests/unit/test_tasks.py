"""kapok.tasks: a stopped task's clean-up has run when the helper returns; the task's own
cancel is swallowed, a cancel of the caller is not."""

from __future__ import annotations

import asyncio

import pytest

from kapok.tasks import cancel_all, cancel_and_wait, spawn


async def test_cancel_and_wait_runs_the_finally_and_swallows_the_cancel() -> None:
    cleaned = asyncio.Event()

    async def worker() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that itself awaits
            cleaned.set()

    task = asyncio.get_running_loop().create_task(worker())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert cleaned.is_set() and task.cancelled()


async def test_cancel_and_wait_takes_none_and_finished_tasks() -> None:
    await cancel_and_wait(None)
    task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await task
    await cancel_and_wait(task)


async def test_cancel_and_wait_raises_what_the_task_ended_with() -> None:
    async def broken() -> None:
        raise ValueError("boom")

    task = asyncio.get_running_loop().create_task(broken())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait(task)


async def test_a_close_path_finishes_even_when_its_caller_is_cancelled_meanwhile() -> None:
    """What follows the wait (freeing a queue, a timer) must run: a close that stopped
    half-way would leak what it was there to free (a WebSocket held by its heartbeat)."""
    release = asyncio.Event()
    freed: list[str] = []

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()

    async def close(inner: asyncio.Task[None]) -> None:
        await cancel_and_wait(inner)
        freed.append("the rest of the close ran")

    inner = asyncio.get_running_loop().create_task(slow_to_stop())
    await asyncio.sleep(0)
    outer = asyncio.get_running_loop().create_task(close(inner))
    await asyncio.sleep(0)
    outer.cancel()
    await asyncio.sleep(0)
    release.set()
    await outer
    assert inner.cancelled() and freed == ["the rest of the close ran"]


async def test_called_while_the_caller_is_being_cancelled_it_still_waits() -> None:
    """In a finally block of a cancelled task (the usual place), the cancel that is already
    under way is not mistaken for a new one."""
    seen: list[str] = []

    async def worker() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            seen.append("worker stopped")

    async def owner() -> None:
        helper = asyncio.get_running_loop().create_task(worker())
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(helper)
            seen.append("owner went on")

    task = asyncio.get_running_loop().create_task(owner())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["worker stopped", "owner went on"]


async def test_cancel_all_waits_for_every_task_and_drops_their_errors() -> None:
    stopped: list[int] = []

    async def worker(i: int) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)
            stopped.append(i)
            if i == 1:
                raise RuntimeError("a failing clean-up")

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(worker(i)) for i in range(3)]
    await asyncio.sleep(0)
    await cancel_all(*tasks)
    await cancel_all()
    assert sorted(stopped) == [0, 1, 2]


async def test_spawn_keeps_the_task_until_it_is_done() -> None:
    import gc

    import kapok.tasks

    release = asyncio.Event()
    ran: list[str] = []

    async def background() -> None:
        await release.wait()
        ran.append("done")

    spawn(background())  # no reference kept here
    gc.collect()
    assert len(kapok.tasks._background) == 1
    release.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == ["done"] and not kapok.tasks._background
