"""Stopping background tasks: cancel, then wait for them to end.

A cancel is only a request: the task ends at its next await, after its ``except`` and
``finally`` blocks have run. An owner that closes a socket, a file or a session after
stopping its task must therefore *await* the task first, or the task's clean-up runs
later, against things that are already closed.

Awaiting a task that ends cancelled raises ``CancelledError`` in the awaiting task as
well, and the owner swallows that one: it asked for it. But the owner may itself be
cancelled while it waits (a shutdown with a time-out, a cancelled request handler), and
that ``CancelledError`` must go on, or the cancel is lost: the owner carries on as if
nothing happened, and a time-out around it never fires. Both arrive as the same
exception; the owner's own cancel is told apart by ``Task.cancelling()``, which counts the
cancels requested of the awaiting task and rises while it waits only if it was cancelled
meanwhile.

A task nobody waits for (a pong, a close in the background) still needs a reference: the
event loop keeps only a weak one, so an unreferenced task can be garbage-collected before
it has finished. ``spawn`` keeps it until it is done.
"""

from __future__ import annotations

import asyncio
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

    The task's own ``CancelledError`` is swallowed; any other exception it ended with is
    raised here. If the caller is cancelled while it waits, ``CancelledError`` is raised.
    """
    if task is None:
        return
    task.cancel()
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise  # the caller was cancelled too, not only the task
        return
    if current is not None and current.cancelling() > before:
        # The task swallowed the cancel (passed on to it from the caller) and ended
        # normally: the caller's cancel still stands.
        raise asyncio.CancelledError


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
