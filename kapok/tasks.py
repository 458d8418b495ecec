"""Stopping background tasks: cancel, then wait for them to end.

A cancel is only a request: the task ends at its next await, after its ``except`` and
``finally`` blocks have run. An owner that closes a socket, a file or a session after
stopping its task must therefore *await* the task first, or the task's clean-up runs
later, against things that are already closed.

Awaiting a task that ends cancelled raises ``CancelledError`` in the awaiting task as
well, and the owner swallows it: it asked for it. ``cancel_and_wait`` also absorbs a cancel
of the owner that arrives while it waits, so that the rest of the close runs (see there).

A task nobody waits for (a pong, a close in the background) still needs a reference: the
event loop keeps only a weak one, so an unreferenced task can be garbage-collected before
it has finished. ``spawn`` keeps it until it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["cancel_all", "cancel_and_wait", "spawn"]

T = TypeVar("T")

# Tasks started by ``spawn`` and not yet done: the reference that keeps each one alive.
_background: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Run ``coro`` as a task of the running loop that nobody needs to keep or await.

    The task is held here until it is done. Nothing cancels it: an owner that must stop
    it on close keeps the returned task itself (and stops it with ``cancel_and_wait``).
    """
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def cancel_and_wait(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended; None and a finished task are fine.

    Its ``CancelledError`` is swallowed, and so is one aimed at the caller while it waits:
    every caller is a close path, and what it does after this (free a queue, cancel a
    heartbeat timer, close a file) must run even when its own task is being cancelled —
    a close that stops half-way leaks exactly what it was there to free. Any other
    exception the task ended with is raised here.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def cancel_all(*tasks: asyncio.Future[Any]) -> None:
    """Cancel every task and wait until all have ended, whatever each ended with.

    Their exceptions are dropped (they are stopping); a cancel of the caller while it
    waits is raised (``asyncio.gather`` passes it on).
    """
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
