"""The blocking wrappers of ``kapok.client.sync`` against a real node (in-process, real
sockets on 127.0.0.1): futures of codes, failures reported by ``flush``, every field of a
message, ``process()``, the behaviour after ``close``, typed options, no thread left behind.

The node runs on the test's event loop, so each script runs in a worker thread
(``asyncio.to_thread``) as a blocking program would."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import socket
import threading
import typing
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from kapok.client import Consumer, Message, Producer
from kapok.client.base import ClientOptions
from kapok.client.sync import SyncConsumer, SyncMessage, SyncProducer
from kapok.errors import ClientClosedError, ClusterUnavailableError, QueueFullError
from kapok.testing.slow import scaled

NodeFactory = Callable[..., Awaitable[Any]]
T = scaled(5.0)  # upper bound of every single wait
FIELDS = (
    "code", "topic", "key", "data", "text", "priority", "create_time", "attempts", "redelivered", "headers",
    "node", "settled",
)  # fmt: skip


@contextlib.contextmanager
def spawned() -> Iterator[list[threading.Thread]]:
    """The threads started in the block by this thread, and by those (a loop's executor
    threads): not the in-process node's, which its own loop starts on the test's thread."""
    parents = {threading.current_thread()}
    threads: list[threading.Thread] = []
    start = threading.Thread.start

    def record(thread: threading.Thread) -> None:
        if threading.current_thread() in parents:
            parents.add(thread)
            threads.append(thread)
        start(thread)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Thread, "start", record)
        yield threads


def alive(threads: list[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threads if t.is_alive()]


async def test_send_returns_a_future_of_the_code(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> tuple[list[str], list[str]]:
        with SyncProducer(node.url, topic="futures") as producer:
            futures = [producer.send(f"m{i}", key="k") for i in range(20)]
            assert all(isinstance(f, concurrent.futures.Future) for f in futures)
            producer.flush()
            assert all(f.done() and not f.cancel() for f in futures)  # settled; never cancellable
            codes = [f.result(0) for f in futures]
        with SyncConsumer(node.url, topic="futures") as consumer:
            got = []
            for msg in consumer:
                got.append(msg.code)
                msg.ack()
                if len(got) == len(codes):
                    break
        return codes, got

    codes, got = await asyncio.to_thread(script)
    assert sorted(got) == sorted(codes) and all(len(code) == 32 for code in codes)


async def test_flush_raises_the_first_failure_and_counts_the_failed(make_node: NodeFactory) -> None:
    node = await make_node("mq.topics.small.max_length=1")

    def script() -> None:
        with SyncProducer(node.url, topic="small") as producer:
            futures = [producer.send(f"m{i}") for i in range(3)]
            with pytest.raises(QueueFullError) as caught:
                producer.flush()
            assert "2 of the 3 messages sent since the last flush failed" in "\n".join(caught.value.__notes__)
            errors = [f.exception(0) for f in futures]
            assert errors.count(None) == 1 and sum(isinstance(e, QueueFullError) for e in errors) == 2
            assert caught.value in errors  # the first failure itself, each future still holds its own
            producer.flush()  # reported once: nothing failed since
        assert producer.stats.failed == 2

    await asyncio.to_thread(script)


async def test_drain_and_leaving_with_report_failures_and_close_does_not(make_node: NodeFactory) -> None:
    node = await make_node("mq.topics.small.max_length=1")

    def script() -> None:
        producer = SyncProducer(node.url, topic="small")
        producer.publish("fills the topic")
        producer.send("no room")
        with pytest.raises(QueueFullError) as caught:
            producer.drain()
        assert "1 of the 1 messages" in "\n".join(caught.value.__notes__)
        producer.drain()  # closed: a no-op, and nothing is reported twice
        with pytest.raises(QueueFullError), SyncProducer(node.url, topic="small") as drained:
            drained.send("no room")  # leaving the block drains
        with pytest.raises(ValueError, match="the block's"), SyncProducer(node.url, topic="small") as left:
            abandoned = left.send("no room")
            raise ValueError("the block's own error")  # wins: leaving closes at once
        closed = SyncProducer(node.url, topic="small")
        stopped = closed.send("no room")
        closed.close()  # stops at once; the future tells what became of the message
        for future in (abandoned, stopped):
            assert isinstance(future.exception(0), QueueFullError | ClientClosedError)

    await asyncio.to_thread(script)


def test_sync_message_exposes_everything_message_does() -> None:
    public = {name for name in dir(Message) if not name.startswith("_")}
    assert public <= set(dir(SyncMessage)), public - set(dir(SyncMessage))


async def test_message_fields_are_those_of_the_delivered_message(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> None:
        with SyncProducer(node.url, topic="fields") as producer:
            code = producer.publish("payload", key="eu.fr", priority=3)
        with SyncConsumer(node.url, topic="fields") as consumer:
            first = consumer.get(T)
            assert (first.code, first.text, first.data, first.key) == (code, "payload", b"payload", "eu.fr")
            assert (first.topic, first.priority, first.attempts, first.redelivered) == ("fields", 3, 1, False)
            assert first.create_time > 0 and first.headers == {} and first.node
            first.nack()
            again = consumer.get(T)
            assert (again.code, again.attempts, again.redelivered) == (code, 2, True)
            for name in FIELDS:
                assert getattr(again, name) == getattr(again.message, name), name
            again.ack()

    await asyncio.to_thread(script)


async def test_process_acks_on_success_and_nacks_on_an_exception(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> None:
        with SyncProducer(node.url, topic="work") as producer:
            producer.publish("fails once")
            producer.publish("fails for good")
            producer.publish("acked by the block")
        with SyncConsumer(node.url, topic="work") as consumer:
            with pytest.raises(RuntimeError, match="boom"), consumer.get(T).process():
                raise RuntimeError("boom")  # nacked, requeued: delivered again
            with pytest.raises(RuntimeError, match="bad"), consumer.get(T).process(requeue=False):
                raise RuntimeError("bad")  # nacked to the dead letters
            with consumer.get(T).process() as msg:
                assert msg.text == "acked by the block" and not msg.settled
                msg.ack(wait=True)  # confirmed by the node; process() leaves it alone
            again = consumer.get(T)
            assert again.text == "fails once" and again.redelivered
            with again.process() as msg:
                assert msg is again
            assert again.settled
            assert consumer.stats.acked == 2 and consumer.stats.nacked == 2
        with SyncConsumer(node.url, topic="work.dlq") as dlq:
            dead = dlq.get(T)
            assert dead.text == "fails for good"
            dead.ack(wait=True)

    await asyncio.to_thread(script)


async def test_every_call_after_close_raises_client_closed(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> None:
        producer = SyncProducer(node.url, topic="closed")
        producer.publish("one")
        producer.close()
        producer.close()  # twice: a no-op
        for call in (lambda: producer.publish("x"), lambda: producer.send("x"), producer.flush):
            with pytest.raises(ClientClosedError):
                call()
        assert producer.stats.confirmed == 1  # still readable

        consumer = SyncConsumer(node.url, topic="closed")
        msg = consumer.get(T)
        consumer.close()
        consumer.close()
        for after in (lambda: consumer.get(0.1), lambda: iter(consumer), msg.ack, msg.nack, msg.touch):
            with pytest.raises(ClientClosedError):
                after()
        with pytest.raises(ClientClosedError), msg.process():
            pass

    await asyncio.to_thread(script)


async def test_close_from_another_thread_ends_an_iteration(make_node: NodeFactory) -> None:
    node = await make_node()

    def script() -> None:
        iterating = threading.Event()

        def iterate(consumer: SyncConsumer) -> list[SyncMessage]:
            messages = iter(consumer)
            iterating.set()
            return list(messages)  # blocks: nothing is published

        with (
            SyncConsumer(node.url, topic="idle") as consumer,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            iteration = pool.submit(iterate, consumer)
            assert iterating.wait(T)
            consumer.close()
            assert iteration.result(T) == []

    await asyncio.to_thread(script)


def keywords(cls: type[Producer | Consumer]) -> dict[str, Any]:
    """The typed keywords ``cls`` takes: its own and ``ClientOptions``."""
    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters.values()
    own = {p.name: hints[p.name] for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return own | typing.get_type_hints(ClientOptions)


@pytest.mark.parametrize(("wrapper", "client"), [(SyncProducer, Producer), (SyncConsumer, Consumer)])
def test_options_are_typed_like_the_clients_keywords(
    wrapper: type[SyncProducer | SyncConsumer], client: type[Producer | Consumer]
) -> None:
    unpacked = typing.get_type_hints(wrapper.__init__)["options"]
    assert typing.get_origin(unpacked) is typing.Unpack, unpacked
    (options,) = typing.get_args(unpacked)
    assert typing.get_type_hints(options) == keywords(client)


def test_send_fields_are_typed_like_the_producers_send() -> None:
    unpacked = typing.get_type_hints(SyncProducer.send)["fields"]
    assert typing.get_origin(unpacked) is typing.Unpack, unpacked
    (fields,) = typing.get_args(unpacked)
    hints = typing.get_type_hints(Producer.send)
    params = inspect.signature(Producer.send).parameters.values()
    assert typing.get_type_hints(fields) == {
        p.name: hints[p.name] for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_a_wrong_keyword_fails_before_any_thread_starts() -> None:
    options: dict[str, Any] = {"tpoic": "typo"}
    with spawned() as threads:
        with pytest.raises(TypeError, match="tpoic"):
            SyncProducer("http://127.0.0.1:1", **options)
        with pytest.raises(TypeError, match="tpoic"):
            SyncConsumer("http://127.0.0.1:1", topic="t", **options)
        with pytest.raises(ValueError, match="seed"):
            SyncProducer("127.0.0.1:1")
    assert threads == []


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL where nothing listens (a bound socket that never listens: connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://localhost:{sock.getsockname()[1]}"


def test_a_failed_start_leaves_no_thread(refused_url: str) -> None:
    with spawned() as threads:
        with pytest.raises(ClusterUnavailableError):
            SyncProducer(refused_url, connect_timeout_s=T)
        with pytest.raises(ClusterUnavailableError):
            SyncConsumer(refused_url, topic="t", connect_timeout_s=T)
    assert threads and alive(threads) == []


async def test_close_stops_the_loop_thread(make_node: NodeFactory) -> None:
    node = await make_node()
    url = node.url.replace("127.0.0.1", "localhost")  # a name: resolved in the loop's executor threads

    def script() -> None:
        with spawned() as threads:
            producer = SyncProducer(url, topic="threads")
            consumer = SyncConsumer(url, topic="threads")
            producer.publish("one")
            consumer.get(T).ack()
            assert {t.name for t in alive(threads)} >= {"kapok-producer", "kapok-consumer"}
            producer.close()
            consumer.close()
        assert alive(threads) == []

    await asyncio.to_thread(script)
