"""The seam between the balancing logic and a wire protocol: one ``NodeSession`` per node.

``Producer`` and ``Consumer`` only ever talk to a ``NodeSession``; ``native.py`` (``/v1/ws``)
and ``kapokmq.py`` (KapokMQ's routes) implement it, and unit tests plug in fakes through
the ``connector`` argument. A connector turns a ``Member`` into an open session, or raises:

* ``ConnectionLostError(in_doubt=False)``, ``NotActiveError``, ``TooManyConnectionsError``:
  this node cannot take work now; nothing was sent, so the work may go elsewhere;
* ``AuthError``: the key is wrong; retrying anywhere is pointless.

``publish`` raises ``ConnectionLostError(in_doubt=True)`` when the connection broke after the
batch was written: the node may or may not have stored it (see ``Producer``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from kapok.client.view import Member
from kapok.errors import KapokError, UnknownCodeError, error_for_code
from kapok.protocol.native import Settle

__all__ = ["Connector", "Deliver", "NodeSession", "SubSpec", "remote_error"]

# A subscription's pushes: its id and a list of native message objects ({code, topic, data, ...}).
Deliver = Callable[[int, list[dict[str, Any]]], None]


@dataclasses.dataclass(frozen=True)
class SubSpec:
    """What a consumer asks each node for."""

    topic: str
    group: str | None = None
    key: str | None = None  # routing-key pattern ("orders.*", "#")
    prefetch: int | None = None  # None = the node's mq.prefetch
    ack: str = "manual"  # "manual" | "auto"
    weight: int | None = None


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

    async def wait_closed(self) -> None: ...

    async def close(self) -> None: ...


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
