"""``SessionPool``: one connection per key for every user; the last user's give-back closes
it; a connection that broke is replaced, once, for everybody."""

from __future__ import annotations

import asyncio

import aiohttp
from tests.unit.client.fakes import FakeNode, FakeSession

from kapok.client import SessionPool
from kapok.client.session import NodeSession
from kapok.client.view import Member

KEY = ("a", "http://a.test:1", 0, "test")


async def test_users_share_one_connection_until_the_last_gives_it_back() -> None:
    node = FakeNode("a")
    opened: list[FakeSession] = []

    async def open_session(http: aiohttp.ClientSession) -> NodeSession:
        await asyncio.sleep(0.01)  # both users ask while it is opening
        session = FakeSession(node, Member("a", node.url, "a"))
        opened.append(session)
        return session

    async with SessionPool() as pool:
        first, second = await asyncio.gather(pool.lease(KEY, open_session), pool.lease(KEY, open_session))
        assert len(opened) == 1 and pool.connections == 1
        await first.close()
        assert [first.closed, second.closed, opened[0].closed] == [True, False, False]
        await second.close()
        assert [opened[0].closed, pool.connections] == [True, 0]


async def test_a_broken_connection_is_replaced_for_the_next_user() -> None:
    node = FakeNode("a")
    opened: list[FakeSession] = []

    async def open_session(http: aiohttp.ClientSession) -> NodeSession:
        session = FakeSession(node, Member("a", node.url, "a"))
        opened.append(session)
        return session

    async with SessionPool() as pool:
        lease = await pool.lease(KEY, open_session)
        await opened[0].close()  # the connection broke
        again = await pool.lease(KEY, open_session)
        assert len(opened) == 2 and not again.closed
        await lease.close()
        await again.close()
    assert pool.connections == 0
