"""The fault proxy of ``kapok.testing.faultproxy`` for synchronous code, on a thread of its own.

``ThreadedFaultProxy`` runs a ``FaultProxy`` on an event loop of its own, in a daemon
thread, for synchronous tests that drive ``kapok serve`` processes; each of its methods
returns once the proxy's loop has done it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kapok.testing.faultproxy import Direction, FaultProxy, Mode, ProxyCounts

__all__ = ["ThreadedFaultProxy"]

T = TypeVar("T")


class ThreadedFaultProxy:
    """A ``FaultProxy`` on its own event loop in a daemon thread, for synchronous code.

    Started by the constructor (so ``port`` and ``url`` are known at once); ``close()`` or
    the ``with`` block's end stops it. Every method waits until the proxy's loop has done
    it, so after ``set_mode("cut")`` returns no further byte is forwarded.
    """

    def __init__(self, target_host: str, target_port: int, *, max_held_bytes: int = 64 * 1024 * 1024) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.proxy = self._call(
                lambda: FaultProxy(target_host, target_port, max_held_bytes=max_held_bytes)
            )
            self._run(self.proxy.start)
        except BaseException:
            self._stop_loop()
            raise

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def mode(self) -> Mode:
        return self.proxy.mode

    def set_mode(
        self, mode: str, *, ms: float = 0.0, direction: Direction | str | None = None, period_ms: float = 0.0
    ) -> Mode:
        return self._call(lambda: self.proxy.set_mode(mode, ms=ms, direction=direction, period_ms=period_ms))

    def reset(self) -> int:
        return self._call(self.proxy.reset)

    def is_open(self, direction: Direction | str) -> bool:
        return self._call(lambda: self.proxy.is_open(direction))

    def counts(self) -> ProxyCounts:
        return self._call(self.proxy.counts)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._run(self.proxy.aclose)
            finally:
                self._stop_loop()

    def __enter__(self) -> ThreadedFaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[[], T]) -> T:
        async def on_loop() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(on_loop(), self._loop).result(10.0)

    def _run(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(10.0)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._loop.close()
