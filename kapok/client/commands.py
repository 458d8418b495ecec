"""``kapok produce`` and ``kapok consume``: the client library behind two shell commands.

produce  each line of stdin (without its line break) is one message; the command waits for
         every confirmation and prints on stderr what was sent and confirmed, per node.
         Exit 0 only if every message was confirmed.
consume  each payload is written to stdout as one line and acked only after the write
         (and flush) succeeded; stops after ``--count`` messages, or after ``--timeout``
         seconds without a message. Exit 0 unless ``--count`` was not reached.

The options are declared in ``kapok.cli`` (so ``kapok --help`` stays instant). The secret
key comes from ``--secret``, else the environment variable ``KAPOK_SECRET``,
else ``test`` (the shipped node's key). ``--key`` is the routing key (produce) or key
pattern (consume), never the secret.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import BinaryIO, TextIO

from kapok.client.consumer import Consumer, Message
from kapok.client.producer import Producer
from kapok.client.stats import Stats
from kapok.errors import ConnectionLostError, KapokError

__all__ = ["SECRET_ENV", "consume", "produce"]

SECRET_ENV = "KAPOK_SECRET"  # also named in kapok.cli
READ_CHUNK = 256 * 1024
EXIT_ERROR = 1


def _secret(args: argparse.Namespace) -> str:
    secret: str = args.secret if args.secret is not None else os.environ.get(SECRET_ENV, "test")
    return secret


def _per_node(stats: Stats, field: str) -> list[str]:
    return [f"  {name}: {getattr(node, field)}" for name, node in sorted(stats.per_node.items())]


# ---------------------------------------------------------------- produce


class AsyncLines:
    """Lines of a binary stream, read in chunks in a worker thread (a pipe, a file or a tty)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.rest = b""

    async def chunks(self) -> list[bytes] | None:
        """The next complete lines (without line breaks), or None at the end of the input."""
        read = getattr(self.stream, "read1", self.stream.read)
        while True:
            chunk: bytes = await asyncio.to_thread(read, READ_CHUNK)
            if not chunk:
                rest, self.rest = self.rest, b""
                return [rest] if rest else None
            lines = (self.rest + chunk).split(b"\n")
            self.rest = lines.pop()
            if lines:
                return [line.removesuffix(b"\r") for line in lines]


async def _produce(args: argparse.Namespace, stdin: BinaryIO, stderr: TextIO) -> int:
    errors: list[BaseException] = []

    def note(future: asyncio.Future[str]) -> None:
        if not future.cancelled() and future.exception() is not None and not errors:
            errors.append(future.exception())  # type: ignore[arg-type]

    producer = Producer(
        args.seed, topic=args.topic, secret=_secret(args), protocol=args.protocol,
        balance=args.balance, publish_timeout_s=args.timeout, name="kapok-produce",
    )  # fmt: skip
    async with producer:
        lines = AsyncLines(stdin)
        while (chunk := await lines.chunks()) is not None:
            for line in chunk:
                future = await producer.send(line, key=args.key, delay_s=args.delay)
                future.add_done_callback(note)
        await producer.flush()
    stats = producer.stats
    print(
        f"kapok produce: sent {stats.sent}, confirmed {stats.confirmed}, retried {stats.retried}, "
        f"failed {stats.failed}", file=stderr,
    )  # fmt: skip
    print("confirmed per node:", *_per_node(stats, "confirmed"), sep="\n", file=stderr)
    if stats.confirmed != stats.sent:
        first = f": {errors[0]}" if errors else ""
        print(f"kapok: error: {stats.sent - stats.confirmed} message(s) not confirmed{first}", file=stderr)
        return EXIT_ERROR
    return 0


def produce(args: argparse.Namespace) -> int:
    return asyncio.run(_produce(args, sys.stdin.buffer, sys.stderr))


# ---------------------------------------------------------------- consume


async def _consume(args: argparse.Namespace, stdout: BinaryIO, stderr: TextIO) -> int:
    if args.count is not None and args.count < 1:
        raise KapokError("--count must be at least 1")
    consumer = Consumer(
        args.seed, topic=args.topic, group=args.group, key=args.key, prefetch=args.prefetch,
        secret=_secret(args), protocol=args.protocol, name="kapok-consume",
    )  # fmt: skip
    done = 0
    wanted = args.count
    async with consumer:
        while wanted is None or done < wanted:
            try:
                first = await consumer.get(args.timeout)
            except TimeoutError:
                break
            batch: list[Message] = [first]
            limit = consumer.buffered if wanted is None else min(consumer.buffered, wanted - done - 1)
            batch += [await consumer.get() for _ in range(limit)]  # what is here: one write
            stdout.write(b"".join(m.data + b"\n" for m in batch))
            stdout.flush()
            for msg in batch:
                # A node that went away delivers it (and we write it) again.
                with contextlib.suppress(ConnectionLostError):
                    await msg.ack()
            done += len(batch)
    stats = consumer.stats
    print(f"kapok consume: {done} message(s)", file=stderr)
    print("received per node:", *_per_node(stats, "received"), sep="\n", file=stderr)
    if wanted is not None and done < wanted:
        print(
            f"kapok: error: got {done} of {wanted} messages before {args.timeout:g} s passed without one",
            file=stderr,
        )
        return EXIT_ERROR
    return 0


def consume(args: argparse.Namespace) -> int:
    return asyncio.run(_consume(args, sys.stdout.buffer, sys.stderr))
