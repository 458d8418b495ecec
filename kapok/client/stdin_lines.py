"""Standard input read from an event loop, for ``kapok produce``.

``StdinChunks`` reads a blocking stream in a daemon thread, one chunk per ``read()``, and
can abort the read under way; ``AsyncLines`` cuts the chunks into lines; ``stdin()`` gives
the process's own standard input as such chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import sys
import threading
from collections.abc import Callable

__all__ = ["AsyncLines", "StdinChunks", "stdin"]

READ_CHUNK = 256 * 1024


class StdinChunks:
    """Chunks of a blocking stream (stdin), read by a daemon thread, one per ``read()``.

    Not ``asyncio.to_thread``: its worker thread is joined when the loop closes and again
    at exit, so a read that never returns (a pipe whose writer stays open, after Ctrl-C)
    would keep the process alive. A daemon thread does not; ``stdin`` gives it raw reads
    of the file descriptor, so it holds no buffered reader's lock that the exit needs.
    """

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self._requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[bytes]]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._waiting: asyncio.Future[bytes] | None = None

    async def read(self) -> bytes:
        """The next chunk; ``b""`` at the end of the input."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._waiting = future
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="kapok-stdin", daemon=True)
            self._thread.start()
        self._requests.put((loop, future))
        return await future

    def abort(self, exc: BaseException) -> None:
        """Make the ``read`` under way raise ``exc`` now (its chunk, when it comes, is dropped)."""
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(exc)

    def _serve(self) -> None:
        while True:
            loop, future = self._requests.get()
            try:
                chunk, error = self._read(READ_CHUNK), None
            except Exception as exc:
                chunk, error = b"", exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, chunk, error)


def _settle(future: asyncio.Future[bytes], chunk: bytes, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(chunk)


def stdin() -> StdinChunks:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # no stdin at all: an empty input
        return StdinChunks(lambda size: b"")
    return StdinChunks(functools.partial(os.read, fd))


class AsyncLines:
    """Lines of a chunked input (a pipe, a file or a tty)."""

    def __init__(self, source: StdinChunks) -> None:
        self.source = source
        self.rest = b""

    async def chunks(self) -> list[bytes] | None:
        """The next complete lines (without line breaks), or None at the end of the input."""
        while True:
            chunk = await self.source.read()
            if not chunk:
                rest, self.rest = self.rest, b""
                return [rest] if rest else None
            lines = (self.rest + chunk).split(b"\n")
            self.rest = lines.pop()
            if lines:
                return [line.removesuffix(b"\r") for line in lines]
