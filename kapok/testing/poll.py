"""Waiting for a condition without guessing how long it takes: poll it, up to a deadline.

A test that sleeps for a fixed time and then looks either waits longer than it needs
to or, on a slow machine, looks too early. ``eventually`` looks again and again and
returns as soon as the condition holds; past the deadline it fails with what it was
waiting for. (Tests that drive real processes, without an event loop of their own,
use ``kapok.launch.wait_for``, with a deadline of ``kapok.testing.slow.scaled(...)``.)

A deadline is a bound set for an ordinary machine, scaled by ``KAPOK_TEST_SLOW``
(``kapok.testing.slow``) so that a loaded machine waits longer instead of failing: the
default one here, and one a test passes, which it writes ``scaled(...)`` (a file's ``T``)
as it does every other bound.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

from kapok.testing.slow import scaled

__all__ = ["eventually"]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0  # on an ordinary machine; times KAPOK_TEST_SLOW


# Two overloads, async check first: against the one signature
# ``Callable[[], T | Awaitable[T]]`` mypy cannot solve T for an async check.
@overload
async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    timeout_s: float | None = ...,
    what: str = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T],
    *,
    timeout_s: float | None = ...,
    what: str = ...,
    interval_s: float = ...,
) -> T: ...


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float | None = None,
    what: str = "the condition",
    interval_s: float = 0.01,
) -> T:
    """Call ``check`` (plain or async) until it returns something true, and return that.

    Raises ``AssertionError`` naming ``what`` once ``timeout_s`` have passed on the event
    loop's clock without it: by default 5 s times ``KAPOK_TEST_SLOW``; one given is used
    as it is (the caller scaled it). Between two calls the loop runs other tasks for
    ``interval_s``, so the number of calls is bounded too.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    loop = asyncio.get_running_loop()
    if timeout_s is None:
        timeout_s = scaled(DEFAULT_TIMEOUT_S)
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
