"""The seam between the balancing logic and a wire protocol: one ``NodeSession`` per node.

``Producer`` and ``Consumer`` only ever talk to a ``NodeSession``; ``native.py`` (``/v1/ws``)
and ``kapokmq.py`` (KapokMQ's routes) implement it, and unit tests plug in fakes through
the ``connector`` argument. A connector turns a ``Member`` into an open session, or raises:

* ``ConnectionLostError(in_doubt=False)``, ``NotActiveError``, ``TooManyConnectionsError``:
  this node cannot take work now; nothing was sent, so the work may go elsewhere;
* ``AuthError``: the key is wrong; retrying anywhere is pointless.

``publish`` raises ``ConnectionLostError(in_doubt=True)`` when the connection broke after the
batch was written: the node may or may not have stored it (see ``Producer``).

``settle`` is fire-and-forget (batched; a node's error about it comes back through the
session's ``on_error``). A session that can also wait for a settle's outcome implements
``ConfirmsSettles`` (both real sessions do; a test fake may not): ``Message.ack(wait=True)``
uses it. It is a protocol of its own so that a ``NodeSession`` stays what it was.

``wait_closed`` returns why the connection ended (None when the session cannot say); the
consumer puts that reason into the error it reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, runtime_checkable

from kapok.client.view import Member
from kapok.errors import KapokError, UnknownCodeError, error_for_code
from kapok.protocol.native import Settle

__all__ = [
    "AckMode",
    "ConfirmsSettles",
    "Connector",
    "Deliver",
    "NodeSession",
    "SubSpec",
    "Unsubscribes",
    "remote_error",
]

# A subscription's pushes: its id and a list of native message objects ({code, topic, data, ...}).
Deliver = Callable[[int, list[dict[str, Any]]], None]

# "manual": the consumer acks each message; "auto": the node settles it as it sends it.
AckMode = Literal["manual", "auto"]


@dataclasses.dataclass(frozen=True)
class SubSpec:
    """What a consumer asks each node for."""

    topic: str
    group: str | None = None
    key: str | None = None  # routing-key pattern ("orders.*", "#")
    prefetch: int | None = None  # None = the node's mq.prefetch
    ack: AckMode = "manual"
    weight: int | None = None
    consumer: str | None = None  # the consumer's name (native protocol); None: the connection's


class NodeSession(Protocol):
    member: Member
    supports_nack: bool  # nack and touch exist on this protocol

    @property
    def closed(self) -> bool: ...

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        """Store a batch; one code (or, KapokMQ mode only, one error) per message. ``topic``
        is the topic of the messages that name none (sent once per frame, not per message)."""
        ...

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        """Subscribe; ``deliver`` gets every push of it. Returns the subscription id."""
        ...

    def settle(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        """Queue an ``ack``, ``nack`` or ``touch`` (sent in one frame per loop turn)."""
        ...

    async def wait_closed(self) -> str | None:
        """Wait until the connection has ended; why it ended, when the session knows."""
        ...

    async def close(self) -> None:
        """Close at once; bounded even when the node does not answer."""
        ...


@runtime_checkable
class ConfirmsSettles(Protocol):
    async def settle_confirmed(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        """Send an ``ack``, ``nack`` or ``touch`` now (after any queued by ``settle``) and wait for
        the node's answer: the node's error if it refused (``UnknownCodeError`` for a code it does
        not hold), ``ConnectionLostError`` if the connection ended first."""
        ...


@runtime_checkable
class Unsubscribes(Protocol):
    def unsubscribe(self, sub: int) -> None:
        """Cancel one subscription, keeping the connection (a ``SessionPool``'s user leaving)."""
        ...


Connector = Callable[[Member], Awaitable[NodeSession]]


def remote_error(code: object, message: object, codes: object = None) -> KapokError:
    """The ``KapokError`` a node named by its machine code; an unknown code keeps its name
    in the message, so nothing the node said is lost."""
    code_s = code if isinstance(code, str) else "internal"
    text = message if isinstance(message, str) else code_s
    exc = error_for_code(code_s, text)
    if type(exc) is KapokError and code_s != "internal":
        exc = KapokError(f"{code_s}: {text}")
    if isinstance(exc, UnknownCodeError) and isinstance(codes, list):
        exc.codes = [c for c in codes if isinstance(c, str)]
    return exc
