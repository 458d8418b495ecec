"""A ``Consumer``'s state and its buffer (its base layer).

``ConsumerState`` holds the settings and every feed, event and pending error of a consumer
(the constructor, with ``Consumer``'s keywords; one ``Feed`` record per pair), and the
buffer that the module docstring of ``kapok.client.consumer`` describes: what a connection
delivers goes in, and what does not fit is nacked back or dropped (``_deliver``,
``_overflow``); what a lost connection delivered and nobody took yet is dropped
(``_forget``); and every failure goes where it is seen (``_report``: ``on_error``, the log,
or the next ``get()``). The layers above use it: ``kapok.client.feeds`` (a subscription on
every pair, kept through failures and takeovers) and ``kapok.client.consumer`` (the public
calls).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Unpack

from kapok.client.base import ClientBase, ClientOptions
from kapok.client.message import Message
from kapok.client.session import AckMode, NodeSession, SubSpec
from kapok.client.view import Member
from kapok.errors import KapokError, SlowConsumerError

__all__ = ["ConsumerState", "Feed", "MessageHandler"]

log = logging.getLogger("kapok.client")

# What ``subscribe`` takes: ``async def handle(message) -> None``, or a plain function.
MessageHandler = Callable[[Message], Awaitable[None] | None]


class Feed:
    __slots__ = (
        "error", "failing_since", "failures", "member", "pair", "session", "subscribed", "task", "tried",
    )  # fmt: skip

    def __init__(self, pair: str, member: Member) -> None:
        self.pair = pair
        self.member = member
        self.session: NodeSession | None = None
        self.task: asyncio.Task[None] | None = None
        self.subscribed = False  # ``session`` holds the subscription
        self.tried = False  # the first attempt has subscribed or failed
        self.failures = 0  # failed attempts in a row: the backoff's exponent
        self.failing_since: float | None = None  # when this run of failures began
        self.error: KapokError | None = None  # the last failure

    @property
    def live(self) -> bool:
        return self.subscribed and self.session is not None and not self.session.closed


class ConsumerState(ClientBase):
    """Settings, feeds, events; the buffer and where failures go (``Consumer``'s base)."""

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        topic: str,
        group: str | None = None,
        key: str | None = None,
        prefetch: int | None = None,
        ack: AckMode = "manual",
        weight: int | None = None,
        max_buffered: int = 10_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(seeds, **options)
        if ack not in ("manual", "auto"):
            raise ValueError(f'ack must be "manual" or "auto", got {ack!r}')
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        # Named in every subscription: a connection shared through a SessionPool carries
        # the name of whichever client opened it.
        self.spec = SubSpec(topic, group, key, prefetch, ack, weight, self.name)
        self.max_buffered = max_buffered
        self.max_buffered_bytes = max_buffered_bytes
        self._feeds: dict[str, Feed] = {}
        self._buffer: collections.deque[Message] = collections.deque()
        self._buffered_bytes = 0
        self._ready = asyncio.Event()  # the buffer got messages, a problem, or the consumer closed
        self._changed = asyncio.Event()  # a feed subscribed or failed
        self._subscribed_once = False
        self._fatal: KapokError | None = None  # raised by start()
        self._problem: KapokError | None = None  # raised by the next get()
        self._handler: MessageHandler | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closing: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ the buffer

    def _deliver(self, session: NodeSession, sub: int, objs: list[dict[str, Any]]) -> None:
        msgs = [Message(obj, self, session, sub) for obj in objs]
        node = self.stats.node(session.member.name)
        node.received += len(msgs)
        self.stats.received += len(msgs)
        room = self.max_buffered - len(self._buffer)
        fits = 0
        size = self._buffered_bytes
        for msg in msgs:
            if fits >= room or (size + len(msg.data) > self.max_buffered_bytes and (fits or self._buffer)):
                break
            size += len(msg.data)
            fits += 1
        self._buffer.extend(msgs[:fits])
        self._buffered_bytes = size
        if fits:
            self._ready.set()
        if fits < len(msgs):
            self._overflow(session, sub, msgs[fits:])

    def _overflow(self, session: NodeSession, sub: int, msgs: list[Message]) -> None:
        self.stats.dropped += len(msgs)
        manual = self.spec.ack == "manual"
        if manual and session.supports_nack and not session.closed:
            session.settle("nack", sub, [m.code for m in msgs], True)
            fate = "requeued on the node"
        elif manual:
            fate = "left to the node's ack timeout"
        else:
            fate = "dropped (auto ack)"
        self._report(SlowConsumerError(
            f"the consumer's buffer is full ({self.max_buffered} messages, {self.max_buffered_bytes} B): "
            f"{len(msgs)} message(s) from {session.member.name} {fate}"
        ))  # fmt: skip

    def _report(self, exc: KapokError, *, in_get: bool = True) -> None:
        """To ``on_error``; else, with a callback, to the log; else, if ``in_get``, to the next
        ``get()`` (the first one waiting is kept)."""
        if self.on_error is not None:
            self._call(self.on_error, exc)
        elif self._handler is not None:
            log.warning("%s: %s", self.name, exc, exc_info=exc.__cause__)
        elif in_get:
            if self._problem is None:
                self._problem = exc
            self._ready.set()

    def _forget(self, session: NodeSession) -> None:
        """Drop what a lost connection delivered and nobody took yet: it comes again."""
        kept = [m for m in self._buffer if m._session is not session]
        if len(kept) != len(self._buffer):
            self._buffer = collections.deque(kept)
            self._buffered_bytes = sum(len(m.data) for m in kept)
