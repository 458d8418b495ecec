"""Waiting for a condition without guessing how long it takes: poll it, up to a deadline.

A test that sleeps for a fixed time and then looks either waits longer than it needs
to or, on a slow machine, looks too early. ``eventually`` looks again and again and
returns as soon as the condition holds; past the deadline it fails with what it was
waiting for. (Tests that drive real processes, without an event loop of their own,
use ``kapok.launch.wait_for``, with a deadline of ``kapok.testing.slow.scaled(...)``.)

The deadline is a bound set for an ordinary machine: it is scaled by ``KAPOK_TEST_SLOW``
(``kapok.testing.slow``), so a loaded machine waits longer instead of failing.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

from kapok.testing.slow import scaled

__all__ = ["eventually"]

T = TypeVar("T")


# Two overloads, async check first: against the one signature
# ``Callable[[], T | Awaitable[T]]`` mypy cannot solve T for an async check.
@overload
async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = ...,
    what: str = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T],
    *,
    timeout_s: float = ...,
    what: str = ...,
    interval_s: float = ...,
) -> T: ...


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = 5.0,
    what: str = "the condition",
    interval_s: float = 0.01,
) -> T:
    """Call ``check`` (plain or async) until it returns something true, and return that.

    Raises ``AssertionError`` naming ``what`` once ``timeout_s`` (times ``KAPOK_TEST_SLOW``)
    have passed on the event loop's clock without it. Between two calls the loop runs other
    tasks for ``interval_s``, so the number of calls is bounded too.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    loop = asyncio.get_running_loop()
    timeout_s = scaled(timeout_s)
    deadline = loop.time() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {result!r})")
        await asyncio.sleep(interval_s)
