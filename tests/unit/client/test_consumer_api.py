"""The consumer's API over fake sessions: ``Message.process()``, confirmed settles, the
callback style, failures reported rather than swallowed, a close that a silent node cannot
hold up, and the documented ``Message`` fields."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from tests.unit.client.fakes import SEED, FakeCluster, FakeSession
from tests.unit.client.fakes_consumer import (
    ApiCluster,
    ConfirmingSession,
    HangingSession,
    NoNackSession,
    RefusingSession,
)

from kapok.client import Consumer, Message, Status
from kapok.client.feeds import SESSION_CLOSE_S
from kapok.errors import (
    ClientError,
    ConnectionLostError,
    KapokError,
    SubscriptionError,
    UnknownCodeError,
    UnsupportedError,
)
from kapok.testing import eventually
from kapok.testing.slow import scaled

FAST: dict[str, Any] = {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "refresh_interval_s": 0.1}


def _consumer(cluster: FakeCluster, **options: Any) -> Consumer:
    return Consumer([SEED], topic="t", connector=cluster.connect, **{**FAST, **options})


def _session(cluster: FakeCluster, name: str = "a") -> FakeSession:
    return cluster.nodes[name].sessions[-1]


def _status(consumer: Consumer) -> Status:
    """``consumer.status`` through a call: mypy would hold an asserted value across awaits."""
    return consumer.status


def _confirming(cluster: FakeCluster, name: str = "a") -> ConfirmingSession:
    session = _session(cluster, name)
    assert isinstance(session, ConfirmingSession)
    return session


# ---------------------------------------------------------------- process()


async def test_process_acks_a_message_when_the_block_ends_and_leaves_a_settled_one_alone() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            _session(cluster).push("c1", "c2")
            first, second = await consumer.get(1), await consumer.get(1)
            async with first.process() as same:
                assert same is first
            async with second.process():
                await second.nack(requeue=False)  # settled inside: process() does nothing more
            await asyncio.sleep(0)
            assert _session(cluster).settled == [("ack", ["c1"], True), ("nack", ["c2"], False)]
            assert first.settled and consumer.stats.acked == 1


@pytest.mark.parametrize("requeue", [True, False])
async def test_process_nacks_a_message_when_the_block_raises_and_lets_the_error_through(
    requeue: bool,
) -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            _session(cluster).push("c1")
            msg = await consumer.get(1)
            with pytest.raises(ValueError, match="bad input"):
                async with msg.process(requeue=requeue):
                    raise ValueError("bad input")
            await asyncio.sleep(0)
            assert _session(cluster).settled == [("nack", ["c1"], requeue)]
            assert consumer.stats.nacked == 1


async def test_process_only_lets_the_error_through_where_nothing_can_be_given_back() -> None:
    for cluster, options in (
        (ApiCluster("a"), {"ack": "auto"}),
        (ApiCluster("a", session=NoNackSession), {}),
    ):
        with cluster.serving():
            async with _consumer(cluster, **options) as consumer:
                _session(cluster).push("c1")
                msg = await consumer.get(1)
                with pytest.raises(KeyError):
                    async with msg.process():
                        raise KeyError("x")
                await asyncio.sleep(0)
                assert _session(cluster).settled == []


async def test_process_after_the_connection_is_gone() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            _session(cluster).push("c1", "c2")
            first, second = await consumer.get(1), await consumer.get(1)
            await _session(cluster).close()
            with pytest.raises(ValueError):  # the node redelivers it: only the error comes out
                async with first.process():
                    raise ValueError("x")
            with pytest.raises(ConnectionLostError):  # the ack cannot go: the work comes again
                async with second.process():
                    pass


# ---------------------------------------------------------------- ack(wait=True)


async def test_a_confirmed_settle_waits_for_the_node_and_raises_its_refusal() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            session = _confirming(cluster)
            session.push("c1", "c2", "c3")
            one, two, three = [await consumer.get(1) for _ in range(3)]
            await one.touch(wait=True)
            await one.ack(wait=True)
            await two.nack(requeue=False, wait=True)
            assert session.confirmed == [
                ("touch", ["c1"], True),
                ("ack", ["c1"], True),
                ("nack", ["c2"], False),
            ]
            session.refusal = UnknownCodeError("1 code(s) are not held by this subscription", ["c3"])
            with pytest.raises(UnknownCodeError):
                await three.ack(wait=True)
            with pytest.raises(UnknownCodeError, match="already"):
                await three.ack()  # it was sent: settling it again is an error
            assert session.settled == []  # none of these took the batched path
            assert consumer.stats.acked == 1 and consumer.stats.nacked == 1


async def test_a_confirmed_settle_on_a_lost_connection_or_a_session_that_cannot_confirm() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            _session(cluster).push("c1")
            msg = await consumer.get(1)
            await _session(cluster).close()
            with pytest.raises(ConnectionLostError):
                await msg.ack(wait=True)
    plain = ApiCluster("a", session=FakeSession)
    with plain.serving():
        async with _consumer(plain) as consumer:
            _session(plain).push("c1")
            msg = await consumer.get(1)
            with pytest.raises(UnsupportedError, match="cannot confirm"):
                await msg.ack(wait=True)
            await msg.ack()  # the batched path still works


# ---------------------------------------------------------------- subscribe(callback)


async def test_a_callback_gets_the_messages_in_order_one_at_a_time_and_each_is_acked() -> None:
    cluster = ApiCluster("a")
    seen: list[str] = []
    running = 0
    most = 0

    async def handle(message: Message) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        seen.append(message.code)
        running -= 1

    with cluster.serving():
        async with _consumer(cluster) as consumer:
            await consumer.subscribe(handle)
            codes = [f"c{i}" for i in range(20)]
            _session(cluster).push(*codes[:10])
            _session(cluster).push(*codes[10:])
            await eventually(lambda: len(seen) == 20, what="every message handled")
            with pytest.raises(ClientError, match="callback"):
                await consumer.get(1)
            with pytest.raises(ClientError, match="already"):
                await consumer.subscribe(handle)
            await asyncio.sleep(0)
            assert [c for op, cs, _ in _session(cluster).settled for c in cs if op == "ack"] == codes
    assert seen == codes and most == 1


async def test_a_plain_function_works_and_concurrency_bounds_the_async_ones() -> None:
    cluster = ApiCluster("a")
    seen: list[str] = []
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            await consumer.subscribe(lambda message: seen.append(message.code))
            _session(cluster).push("c1", "c2")
            await eventually(lambda: seen == ["c1", "c2"], what="the plain callback")
    running = 0
    most = 0
    release = asyncio.Event()

    async def slow(message: Message) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster) as consumer:
            await consumer.subscribe(slow, concurrency=3)
            _session(cluster).push(*(f"c{i}" for i in range(10)))
            await eventually(lambda: running == 3, what="three callbacks at once")
            await asyncio.sleep(0.01)
            assert most == 3 and consumer.buffered == 7
            release.set()
            await eventually(lambda: consumer.stats.acked == 10, what="every message acked")


async def test_a_failing_callback_nacks_with_requeue_and_reports_it() -> None:
    cluster = ApiCluster("a")
    errors: list[KapokError] = []

    async def handle(message: Message) -> None:
        if message.code == "c2":
            raise RuntimeError("cannot handle c2")

    with cluster.serving():
        async with _consumer(cluster, on_error=errors.append) as consumer:
            await consumer.subscribe(handle)
            _session(cluster).push("c1", "c2", "c3")
            await eventually(lambda: consumer.stats.acked == 2, what="the others acked")
            await asyncio.sleep(0)
            assert ("nack", ["c2"], True) in _session(cluster).settled
    (error,) = errors
    assert isinstance(error, ClientError) and isinstance(error.__cause__, RuntimeError)
    assert "c2" in str(error) and "cannot handle c2" in str(error)


async def test_close_stops_the_callback_and_gives_its_message_back() -> None:
    cluster = ApiCluster("a")
    started = asyncio.Event()

    async def forever(message: Message) -> None:
        started.set()
        await asyncio.Event().wait()

    with cluster.serving():
        consumer = await _consumer(cluster).start()
        await consumer.subscribe(forever)
        session = _session(cluster)
        session.push("c1")
        await asyncio.wait_for(started.wait(), scaled(1))
        await consumer.close()
    assert ("nack", ["c1"], True) in session.settled and consumer.status is Status.CLOSED


# ---------------------------------------------------------------- failures are reported


async def test_start_raises_and_reports_each_attempt_when_no_node_can_be_reached() -> None:
    cluster = ApiCluster("a")
    cluster.nodes["a"].refuse = True
    errors: list[KapokError] = []
    with cluster.serving():
        consumer = _consumer(cluster, connect_timeout_s=0.3, on_error=errors.append)
        with pytest.raises(ConnectionLostError, match="no node took the subscription") as caught:
            await consumer.start()
    assert "cannot connect to a" in str(caught.value) and consumer.status is Status.CLOSED
    assert errors and all("cannot connect to a" in str(e) for e in errors)
    assert len(errors) == consumer.stats.node("a").failures


async def test_a_subscription_no_retry_can_mend_is_raised_by_start_as_itself() -> None:
    cluster = ApiCluster("a", session=RefusingSession)
    errors: list[KapokError] = []
    with cluster.serving():
        consumer = _consumer(cluster, group="g", on_error=errors.append)
        with pytest.raises(SubscriptionError, match="a refused the subscription to 't'"):
            await consumer.start()
    assert len(errors) == 1 and consumer.status is Status.CLOSED


async def test_one_failing_feed_of_several_is_reported_but_not_raised_by_get() -> None:
    cluster = ApiCluster("a", "b")
    cluster.nodes["b"].refuse = True
    errors: list[KapokError] = []
    with cluster.serving():
        async with _consumer(cluster, on_error=errors.append) as consumer:
            await eventually(lambda: len(errors) >= 2, what="two failed attempts on b")
            assert all(re.search(r"\bb\b", str(e)) for e in errors)
        cluster = ApiCluster("a", "b")
        cluster.nodes["b"].refuse = True
        async with _consumer(cluster, connect_timeout_s=0.05) as consumer:  # no on_error
            await eventually(lambda: consumer.stats.node("b").failures >= 3, what="b failing")
            _session(cluster).push("a1")
            assert (await consumer.get(1)).code == "a1"  # a delivers: nothing is raised
            with pytest.raises(TimeoutError):
                await consumer.get(0.05)


async def test_a_lost_connection_that_comes_back_in_time_is_not_raised_by_get() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        async with _consumer(cluster, connect_timeout_s=5) as consumer:  # no on_error
            await _session(cluster).close()
            await eventually(lambda: len(cluster.nodes["a"].sessions) == 2, what="the feed back")
            _session(cluster).push("a1")
            assert (await consumer.get(1)).code == "a1"


async def test_get_raises_when_every_feed_has_been_failing_for_connect_timeout_s() -> None:
    cluster = ApiCluster("a")
    with cluster.serving():
        began = time.monotonic()  # the subscription is lost at once: failing since its attempt began
        async with _consumer(cluster, connect_timeout_s=0.2) as consumer:  # no on_error
            cluster.nodes["a"].refuse = True
            await _session(cluster).close()
            with pytest.raises(ConnectionLostError, match="cannot connect to a"):
                await consumer.get(scaled(5))
            assert time.monotonic() - began >= 0.2
            assert _status(consumer) is Status.RECONNECTING
            cluster.nodes["a"].refuse = False  # back: get() delivers again
            await eventually(lambda: _status(consumer) is Status.CONNECTED, what="the feed back")
            _session(cluster).push("a1")
            assert (await consumer.get(1)).code == "a1"


# ---------------------------------------------------------------- close


async def test_close_is_bounded_when_a_node_never_answers_and_survives_a_cancel() -> None:
    cluster = ApiCluster("a", "b", session=HangingSession)
    with cluster.serving():
        consumer = await _consumer(cluster).start()
        began = time.monotonic()
        closing = asyncio.create_task(consumer.close())
        await asyncio.sleep(0)  # it starts the close
        closing.cancel()  # the caller gives up: the close goes on in the background
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert consumer.status is Status.CLOSED
        again = asyncio.create_task(consumer.close())  # the same close, awaited again
        done, _ = await asyncio.wait([again], timeout=SESSION_CLOSE_S + scaled(1.0))
        assert again in done, f"still closing after {time.monotonic() - began:.2f} s"


# ---------------------------------------------------------------- the API's shape


def test_the_message_fields_are_documented() -> None:
    doc = Message.__doc__ or ""
    for field in ("code", "topic", "key", "data", "priority", "create_time", "attempts", "redelivered",
                  "headers", "node"):  # fmt: skip
        assert f"``{field}``" in doc, field


def test_ack_takes_manual_or_auto_only() -> None:
    with pytest.raises(ValueError, match="manual"):
        Consumer([SEED], topic="t", ack="sometimes")  # type: ignore[arg-type]
