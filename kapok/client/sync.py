"""Blocking wrappers for scripts: ``SyncProducer`` and ``SyncConsumer``.

Each runs its async client on an event loop in a daemon thread of its own
(``kapok-producer`` / ``kapok-consumer``) and waits there for every call, so it works from
code that has no event loop. Not for use *inside* a running event loop: use the async
classes there.

* Arguments are the async client's, typed: ``ProducerOptions``, ``ConsumerOptions`` and
  ``SendOptions`` (``**options: Unpack[...]``: mypy checks them). The client is built in
  the caller's thread, so a wrong keyword (``TypeError``) or a bad seed (``ValueError``)
  raises before any thread starts; a ``start`` that fails (no seed answers) stops the
  thread before its error is raised.
* ``SyncProducer.send`` returns a ``concurrent.futures.Future`` of the code. A message on
  its way cannot be called back, so the future cannot be cancelled. Its callbacks run on
  the loop thread: keep them short, and make no blocking call of the wrapper there (that
  raises ``RuntimeError`` rather than waiting for itself).
* ``flush()`` waits until every message is confirmed or failed; then, if messages sent
  since the last ``flush`` failed, it raises the first failure — its own class, so
  ``except QueueFullError`` works — with a note (``add_note``) saying how many of how many
  failed. Each future still holds its own message's outcome. ``drain()``, and leaving
  ``with`` without an error, wait the same way (at most ``publish_timeout_s``), close, and
  raise the same way (a message unconfirmed by then fails with ``ClientClosedError``).
  ``close()`` stops at once and raises nothing about messages: their futures tell.
* ``SyncMessage`` reads every field of the delivered ``Message`` (kept as ``message``)
  and has blocking ``ack`` / ``nack`` / ``touch`` and ``with message.process():``.
* After ``close()`` (a second one is a no-op) every call raises ``ClientClosedError``, the
  calls of the messages delivered before included; ``stats`` stays readable. A call
  blocked in another thread ends with ``ClientClosedError``; an iteration ends. ``close``
  does what ``asyncio.run`` does at its end (cancels what is left on the loop, shuts the
  loop's executor down) and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import Coroutine, Iterator, Sequence
from types import TracebackType
from typing import Any, Generic, Required, Self, TypeVar, Unpack

from kapok.client.base import ClientOptions
from kapok.client.consumer import Consumer, Message
from kapok.client.producer import Balance, Producer, SendOptions
from kapok.client.session import AckMode
from kapok.client.stats import Stats
from kapok.errors import ClientClosedError

__all__ = [
    "ConsumerOptions", "ProducerOptions", "SendOptions", "SyncConsumer", "SyncMessage", "SyncProducer",
]  # fmt: skip

T = TypeVar("T")
C = TypeVar("C", Producer, Consumer)


class ProducerOptions(ClientOptions, total=False):
    """``Producer``'s keywords: its own and the shared ``ClientOptions``."""

    topic: str | None
    balance: Balance
    batch_size: int
    batch_bytes: int
    linger_s: float
    max_inflight: int
    max_pending: int
    max_pending_bytes: int
    dedup: bool
    publish_timeout_s: float
    in_doubt_wait_s: float
    max_message_bytes: int


class ConsumerOptions(ClientOptions, total=False):
    """``Consumer``'s keywords: its own (``topic`` is required) and the shared ``ClientOptions``."""

    topic: Required[str]
    group: str | None
    key: str | None
    prefetch: int | None
    ack: AckMode
    weight: int | None
    max_buffered: int
    max_buffered_bytes: int


class _LoopThread:
    """An event loop running in a thread of its own, and the blocking calls into it."""

    def __init__(self, name: str, owner: str) -> None:
        self.owner = owner
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()  # "closed yet?" and handing a call to the loop are one step
        self._closed = False
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"the {self.owner} is closed")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result (or raise its error)."""
        with self._lock:
            try:
                self._check_caller()
                self.check_open()
            except BaseException:
                coro.close()  # never started: no "never awaited" warning
                raise
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:  # close() cancelled what was still running
                raise ClientClosedError(f"the {self.owner} was closed during the call") from None
            raise
        except BaseException:
            if not future.done():  # say a KeyboardInterrupt while waiting: stop the call too
                future.cancel()
            raise

    def close(self, last: Coroutine[Any, Any, None]) -> None:
        """Run ``last`` (the client's own close), then cancel what is left on the loop, shut
        its executor down and join the thread; ``last``'s error is raised after that. Only the
        first call does anything: every later ``run`` or ``close`` finds the loop closed."""
        with self._lock:
            try:
                self._check_caller()
            except BaseException:
                last.close()
                raise
            if self._closed:
                last.close()
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(last), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()

    async def _shutdown(self, last: Coroutine[Any, Any, None]) -> None:
        try:
            await last
        finally:  # what asyncio.run does at its end: nothing started on the loop outlives it
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

    def _check_caller(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                f"a blocking call of the {self.owner} from its own loop thread would wait for itself"
            )


class _SyncBase(Generic[C]):
    """Starts the async client on its own loop thread; ``close`` stops both."""

    def __init__(self, client: C, thread_name: str) -> None:
        self._client: C = client
        self._loop = _LoopThread(thread_name, type(self).__name__)
        try:
            self._loop.run(client.start())
        except BaseException:
            with contextlib.suppress(Exception):  # the start's error is the one to raise
                self._loop.close(client.close())
            raise

    @property
    def stats(self) -> Stats:
        return self._client.stats

    def close(self) -> None:
        """Close the client and stop its thread; a second call is a no-op."""
        self._loop.close(self._client.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncProducer(_SyncBase[Producer]):
    """``Producer`` with blocking calls and the same arguments. ``publish`` returns the
    code, ``send`` a future of it, ``flush`` and ``drain`` raise what failed (see the
    module's docstring); leaving ``with`` drains, or closes at once after an error."""

    def __init__(self, seeds: Sequence[str] | str, **options: Unpack[ProducerOptions]) -> None:
        # Touched on the loop thread only: counted by send and its futures, reset by flush.
        self._sent = 0
        self._failed = 0
        self._first_failure: BaseException | None = None
        super().__init__(Producer(seeds, **options), "kapok-producer")

    def publish(self, data: bytes | str, **fields: Unpack[SendOptions]) -> str:
        """Publish one message; returns its code once a node confirmed it."""
        return self._loop.run(self._client.publish(data, **fields))

    def send(self, data: bytes | str, **fields: Unpack[SendOptions]) -> concurrent.futures.Future[str]:
        """Queue one message and return a future of its code (blocks only while
        ``max_pending`` messages are unconfirmed)."""
        return self._loop.run(self._send(data, fields))

    def flush(self) -> None:
        """Send what is batched and wait until every message is confirmed or failed; then
        raise the first failure since the last flush, if any, noting how many failed."""
        self._loop.run(self._flush())

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait for every confirmation (at most ``timeout_s``, default ``publish_timeout_s``),
        close, and raise like ``flush`` (what was unconfirmed failed with ``ClientClosedError``)."""
        self._loop.close(self._drain(timeout_s))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.drain()
        else:  # do not make an error wait for confirmations
            self.close()

    async def _send(self, data: bytes | str, fields: SendOptions) -> concurrent.futures.Future[str]:
        sent = await self._client.send(data, **fields)
        self._sent += 1
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # from now on cancel() is refused
        sent.add_done_callback(functools.partial(self._settle, future))
        return future

    def _settle(self, future: concurrent.futures.Future[str], sent: asyncio.Future[str]) -> None:
        error = ClientClosedError("the send was cancelled") if sent.cancelled() else sent.exception()
        if error is None:
            future.set_result(sent.result())
            return
        self._failed += 1
        if self._first_failure is None:
            self._first_failure = error
        future.set_exception(error)

    async def _flush(self) -> None:
        await self._client.flush()
        await self._raise_failures()

    async def _drain(self, timeout_s: float | None) -> None:
        await self._client.drain(timeout_s)
        await self._raise_failures()

    async def _raise_failures(self) -> None:
        # Every message is settled now, but a future's callbacks (_settle) run in a later loop
        # step than its settlement: one step more and they have all run.
        await asyncio.sleep(0)
        first, failed, sent = self._first_failure, self._failed, self._sent
        self._first_failure, self._failed, self._sent = None, 0, 0
        if first is not None:
            first.add_note(
                f"{failed} of the {sent} messages sent since the last flush failed; this is the "
                "first of them (each send()'s future holds its own message's outcome)"
            )
            raise first


class SyncMessage:
    """A delivered ``Message`` (kept as ``message``) with blocking ``ack`` / ``nack`` /
    ``touch`` and ``process``. Its fields are the message's own, read through: ``code``,
    ``topic``, ``key``, ``data``, ``text``, ``priority``, ``create_time``, ``attempts``,
    ``redelivered``, ``headers``, ``node``, ``settled`` (``Message`` says what each means)."""

    __slots__ = ("_loop", "message")

    def __init__(self, message: Message, loop: _LoopThread) -> None:
        self.message = message
        self._loop = loop

    def __repr__(self) -> str:
        return f"<Sync{repr(self.message)[1:]}"

    @property
    def code(self) -> str:
        return self.message.code

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def data(self) -> bytes:
        return self.message.data

    @property
    def text(self) -> str:
        return self.message.text

    @property
    def key(self) -> str:
        return self.message.key

    @property
    def headers(self) -> dict[str, str]:
        return self.message.headers

    @property
    def priority(self) -> int:
        return self.message.priority

    @property
    def create_time(self) -> float:
        return self.message.create_time

    @property
    def attempts(self) -> int:
        return self.message.attempts

    @property
    def redelivered(self) -> bool:
        return self.message.redelivered

    @property
    def node(self) -> str:
        return self.message.node

    @property
    def settled(self) -> bool:
        return self.message.settled

    def ack(self, *, wait: bool = False) -> None:
        """Done with it (manual mode; a no-op on an auto-ack subscription). ``wait``: until
        the node has acked it, else the ack is queued and sent with the loop's next frame."""
        self._loop.run(self.message.ack(wait=wait))

    def nack(self, requeue: bool = True, *, wait: bool = False) -> None:
        """Give it back: redelivered (``requeue=True``) or dead-lettered at once."""
        self._loop.run(self.message.nack(requeue, wait=wait))

    def touch(self, *, wait: bool = False) -> None:
        """Still working on it: extends its ack deadline."""
        self._loop.run(self.message.touch(wait=wait))

    @contextlib.contextmanager
    def process(self, requeue: bool = True) -> Iterator[Self]:
        """``with message.process():`` — ``Message.process()``, blocking: acks the message
        when the block ends, nacks it (``requeue``) when the block raises and lets the error
        through; a block that settled the message itself is left alone."""
        processing = self.message.process(requeue)
        self._loop.run(processing.__aenter__())
        try:
            yield self
        except BaseException as exc:
            with contextlib.suppress(ClientClosedError):  # closed meanwhile: the node redelivers it
                self._loop.run(processing.__aexit__(type(exc), exc, exc.__traceback__))
            raise
        self._loop.run(processing.__aexit__(None, None, None))


class SyncConsumer(_SyncBase[Consumer]):
    """``Consumer`` with a blocking ``get`` and iteration, and the same arguments."""

    def __init__(self, seeds: Sequence[str] | str, **options: Unpack[ConsumerOptions]) -> None:
        super().__init__(Consumer(seeds, **options), "kapok-consumer")

    def get(self, timeout_s: float | None = None) -> SyncMessage:
        """The next message; ``TimeoutError`` after ``timeout_s`` without one."""
        return SyncMessage(self._loop.run(self._client.get(timeout_s)), self._loop)

    def __iter__(self) -> Iterator[SyncMessage]:
        """The messages as they come; the iteration ends when the consumer is closed."""
        self._loop.check_open()
        return self._messages()

    def _messages(self) -> Iterator[SyncMessage]:
        while True:
            try:
                message = self.get()
            except ClientClosedError:
                return
            yield message
