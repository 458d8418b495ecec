"""``Message``: what a ``Consumer`` hands out, and how it is settled.

A message is settled on the connection that delivered it, once: ``ack`` (done), ``nack``
(give it back: redelivered, or dead-lettered with ``requeue=False``), and any number of
``touch`` calls before (still working: extends the ack deadline). By default these are
fire-and-forget: queued, and sent in one frame per loop turn with the others of that turn
(see ``native.py``). ``wait=True`` sends the one call's frame with a request id and waits
for the node's answer; a code the node no longer holds (its ack deadline passed and it was
redelivered) then raises ``UnknownCodeError`` here instead of going to ``on_error``.

``process()`` is aio-pika's context manager: ack on a normal exit, nack on an exception,
nothing if the block settled the message itself.
"""

from __future__ import annotations

import base64
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kapok.client.session import ConfirmsSettles, NodeSession
from kapok.errors import ConnectionLostError, UnknownCodeError, UnsupportedError
from kapok.protocol.native import Settle

if TYPE_CHECKING:
    from kapok.client.consumer_state import ConsumerState

__all__ = ["Message", "Processing"]


class Message:
    """A delivered message.

    ``code``: its id on the node (32 hex digits; KapokMQ's own codes otherwise).
    ``topic``, ``key`` (the routing key, ``""`` for none), ``data`` (bytes; ``text`` decodes
    them as UTF-8).
    ``priority``: 0–9 as published; higher is delivered first among a group's ready messages.
    ``create_time``: when the node stored it, in seconds since the epoch on the node's clock.
    ``attempts``: deliveries so far, this one included (1 the first time; 0 over the KapokMQ
    protocol, which does not say). ``redelivered``: ``attempts > 1`` — a consumer had it
    before and did not ack it (nacked it, lost its connection or let the ack deadline pass),
    so the work may have been done once already.
    ``headers``: text headers, name to value: those the producer set, and on a dead letter the
    node's ``reason`` and ``attempts``; empty when there are none.
    ``node``: the name of the member that delivered it; ``ack`` / ``nack`` / ``touch`` go back
    on that connection, and raise ``ConnectionLostError`` once it is gone (the node delivers
    the message again).
    """

    __slots__ = (
        "_consumer", "_session", "_settled", "_sub", "attempts", "code", "create_time", "data",
        "headers", "key", "node", "priority", "redelivered", "topic",
    )  # fmt: skip

    def __init__(self, obj: dict[str, Any], consumer: ConsumerState, session: NodeSession, sub: int) -> None:
        data = obj.get("data", "")
        self.code: str = obj["code"]
        self.topic: str = obj.get("topic", "")
        self.data: bytes = base64.b64decode(data) if obj.get("enc") == "base64" else data.encode()
        self.key: str = obj.get("key", "")
        self.priority: int = obj.get("priority", 0)
        self.create_time: float = obj.get("create_time", 0.0)
        self.attempts: int = obj.get("attempts", 1)
        self.redelivered: bool = obj.get("redelivered", False)
        self.headers: dict[str, str] = obj.get("headers") or {}
        self.node = session.member.name
        self._consumer = consumer
        self._session = session
        self._sub = sub
        self._settled = False

    @property
    def text(self) -> str:
        return self.data.decode()

    @property
    def settled(self) -> bool:
        """Acked or nacked by this client (always False on an auto-ack subscription)."""
        return self._settled

    def __repr__(self) -> str:
        return f"<Message {self.code} topic={self.topic!r} node={self.node!r} {len(self.data)} B>"

    async def ack(self, *, wait: bool = False) -> None:
        """Done with it (manual mode; a no-op on an auto-ack subscription). ``wait``: until the
        node has acked it (over KapokMQ's protocol: until the ack is written; see there)."""
        if self._consumer.spec.ack == "auto":
            return
        await self._settle("ack", True, wait)
        self._consumer.stats.acked += 1

    async def nack(self, requeue: bool = True, *, wait: bool = False) -> None:
        """Give it back: redelivered (``requeue=True``) or dead-lettered at once."""
        await self._settle("nack", requeue, wait)
        self._consumer.stats.nacked += 1

    async def touch(self, *, wait: bool = False) -> None:
        """Still working on it: extends its ack deadline."""
        await self._settle("touch", True, wait)

    def process(self, requeue: bool = True) -> Processing:
        """``async with message.process():`` acks the message when the block ends normally and
        nacks it when the block raises (``requeue``: redelivered, else dead-lettered), then lets
        the exception through. A block that acked or nacked the message itself is left alone.

        Unlike aio-pika, ``requeue`` defaults to True: the topic's ``max_deliveries`` moves a
        message that keeps failing to the dead-letter topic. Where nothing can be given back
        — an auto-ack subscription, the KapokMQ protocol (no nack), a connection already gone
        (the node redelivers) — an exception is only let through. The ack on a normal exit
        raises what ``ack`` raises (``ConnectionLostError``: the work will be delivered again).
        """
        return Processing(self, requeue)

    def _give_back(self, requeue: bool) -> None:
        """Nack after a failure, where that is possible; never raises."""
        session = self._session
        if self._settled or self._consumer.spec.ack == "auto" or not session.supports_nack or session.closed:
            return
        session.settle("nack", self._sub, [self.code], requeue)
        self._settled = True
        self._consumer.stats.nacked += 1

    async def _settle(self, op: Settle, requeue: bool, wait: bool) -> None:
        if self._consumer.spec.ack == "auto":
            raise UnsupportedError(f"{op} on an auto-ack subscription: the message is settled already")
        session = self._session
        if op != "ack" and not session.supports_nack:
            raise UnsupportedError(f"the {self._consumer.protocol} protocol has no {op}")
        if self._settled:
            raise UnknownCodeError(f"message {self.code} was acked or nacked already", [self.code])
        if session.closed:
            raise ConnectionLostError(
                f"the connection to {self.node} that delivered {self.code} is gone; "
                "the node delivers the message again",
                False,
            )
        if not wait:
            session.settle(op, self._sub, [self.code], requeue)
            self._settled = op != "touch"
            return
        if not isinstance(session, ConfirmsSettles):
            raise UnsupportedError(f"the connection to {self.node} cannot confirm a {op}")
        self._settled = op != "touch"  # a second call fails at once, even while this one waits
        await session.settle_confirmed(op, self._sub, [self.code], requeue)


class Processing:
    """What ``Message.process()`` returns: an async context manager around handling a message."""

    __slots__ = ("_message", "_requeue")

    def __init__(self, message: Message, requeue: bool) -> None:
        self._message = message
        self._requeue = requeue

    async def __aenter__(self) -> Message:
        return self._message

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        message = self._message
        if exc is not None:  # a cancel too: give the message back at once, without waiting
            message._give_back(self._requeue)
        elif not message._settled:
            await message.ack()
