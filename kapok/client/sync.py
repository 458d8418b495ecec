"""Blocking wrappers for scripts: ``SyncProducer`` and ``SyncConsumer``.

Each runs its async client on an event loop in a private daemon thread and waits for the
results (``asyncio.run_coroutine_threadsafe``), so it works from any code that has no
event loop of its own. Not for use *inside* a running event loop: use the async classes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from kapok.client.consumer import Consumer, Message
from kapok.client.producer import Producer
from kapok.client.stats import Stats

__all__ = ["SyncConsumer", "SyncMessage", "SyncProducer"]

T = TypeVar("T")
C = TypeVar("C", Producer, Consumer)


class _LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)
        if not self.thread.is_alive():
            self.loop.close()


class _SyncBase(Generic[C]):
    """Starts the async client on its own loop thread; ``close`` stops both."""

    def __init__(self, make: Callable[[], C], thread_name: str) -> None:
        self._thread = _LoopThread(thread_name)

        async def start() -> C:
            return await make().start()

        try:
            self._client: C = self._thread.run(start())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def stats(self) -> Stats:
        return self._client.stats

    def close(self) -> None:
        try:
            self._thread.run(self._client.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncProducer(_SyncBase[Producer]):
    """``Producer`` with blocking calls; same arguments. ``publish`` returns the code."""

    def __init__(self, seeds: Sequence[str] | str, **options: Any) -> None:
        super().__init__(lambda: Producer(seeds, **options), "kapok-producer")

    def publish(self, data: bytes | str, **fields: Any) -> str:
        return self._thread.run(self._client.publish(data, **fields))

    def send(self, data: bytes | str, **fields: Any) -> None:
        """Queue a message without waiting for its confirmation (see ``flush``)."""
        self._thread.run(self._client.send(data, **fields))

    def flush(self) -> None:
        self._thread.run(self._client.flush())


class SyncMessage:
    """A delivered message with blocking ``ack`` / ``nack`` / ``touch``."""

    def __init__(self, message: Message, thread: _LoopThread) -> None:
        self.message = message
        self.code = message.code
        self.data = message.data
        self.topic = message.topic
        self.key = message.key
        self.node = message.node
        self._thread = thread

    @property
    def text(self) -> str:
        return self.data.decode()

    def ack(self) -> None:
        self._thread.run(self.message.ack())

    def nack(self, requeue: bool = True) -> None:
        self._thread.run(self.message.nack(requeue))

    def touch(self) -> None:
        self._thread.run(self.message.touch())


class SyncConsumer(_SyncBase[Consumer]):
    """``Consumer`` with a blocking ``get`` and iteration; same arguments."""

    def __init__(self, seeds: Sequence[str] | str, **options: Any) -> None:
        super().__init__(lambda: Consumer(seeds, **options), "kapok-consumer")

    def get(self, timeout_s: float | None = None) -> SyncMessage:
        return SyncMessage(self._thread.run(self._client.get(timeout_s)), self._thread)

    def __iter__(self) -> Iterator[SyncMessage]:
        while True:
            yield self.get()
