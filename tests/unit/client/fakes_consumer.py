"""Fake sessions for the consumer's API tests, on top of ``fakes.py``'s nodes.

``ApiCluster`` is a ``FakeCluster`` whose connections are made by a chosen session class:
``ConfirmingSession`` answers confirmed settles (``ack(wait=True)``), ``NoNackSession`` is a
protocol without nack (KapokMQ's), ``RefusingSession`` refuses every subscription,
``HangingSession`` never finishes a close (a node that stopped answering).
"""

from __future__ import annotations

import asyncio

from tests.unit.client.fakes import FakeCluster, FakeNode, FakeSession

from kapok.client.session import Deliver, SubSpec
from kapok.client.view import Member
from kapok.errors import ConnectionLostError, KapokError, SubscriptionError


class ConfirmingSession(FakeSession):
    """Answers ``settle_confirmed`` one loop turn later: ``refusal`` if set, else ok."""

    def __init__(self, node: FakeNode, member: Member) -> None:
        super().__init__(node, member)
        self.confirmed: list[tuple[str, list[str], bool]] = []
        self.refusal: KapokError | None = None

    async def settle_confirmed(self, op: str, sub: int, codes: list[str], requeue: bool = True) -> None:
        await asyncio.sleep(0)  # a round trip
        if self.closed:
            raise ConnectionLostError(f"lost {self.member.name}")
        if self.refusal is not None:
            raise self.refusal
        self.confirmed.append((op, codes, requeue))


class NoNackSession(FakeSession):
    supports_nack = False


class RefusingSession(FakeSession):
    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        raise SubscriptionError(f"group {spec.group!r} is not allowed here")


class HangingSession(FakeSession):
    async def close(self) -> None:
        self._closed = True
        self._done.set()
        await asyncio.Event().wait()  # the node never answers our close frame


class ApiCluster(FakeCluster):
    def __init__(self, *names: str, session: type[FakeSession] = ConfirmingSession) -> None:
        super().__init__(*names, session=session)
