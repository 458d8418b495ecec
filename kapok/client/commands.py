"""``kapok produce`` and ``kapok consume``: the client library behind two shell commands.

produce  each line of stdin (without its line break) is one message; the command waits for
         every confirmation and prints on stderr what was sent and confirmed, per node.
consume  each payload is written to stdout as one line and acked only after the write
         (and flush) succeeded; stops after ``--count`` messages, or after ``--timeout``
         seconds without a message.

Exit codes (every error is one line ``kapok: error: ...`` on stderr, never a traceback):

0    produce: every message was confirmed; consume: ``--count`` reached, or no ``--count``
1    an error at run time: no node answered, the key was refused, a message was not
     confirmed (after the summary), ``--count`` not reached (after the summary)
2    bad input: an option that ``kapok.cli`` rejects before anything is sent
130  interrupted (Ctrl-C, SIGINT): instead of the summary, one line
     ``kapok produce: interrupted: sent N, confirmed N, pending N`` (pending: neither
     confirmed nor failed when the interrupt came; they may or may not be stored) or
     ``kapok consume: interrupted: received N, acked N`` (received: lines written)

Progress: while it runs, a live line on stderr (rich) counts the messages and their rate,
when stderr is a terminal and the data is not (stdin for produce, stdout for consume: a
person typing or reading there would fight with it); ``--progress`` / ``--no-progress``
decide instead. The line is gone before the summary, so what follows is the same with or
without it.

The options are declared and checked in ``kapok.cli_options`` (so ``kapok --help`` stays instant).
The secret key comes from ``--secret``, else the environment variable ``KAPOK_SECRET``,
else ``test`` (the shipped node's key). ``--key`` is the routing key (produce) or key
pattern (consume), never the secret.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TextIO

from kapok.client.consumer import Consumer, Message
from kapok.client.producer import Producer
from kapok.client.stats import Stats
from kapok.client.stdin_lines import AsyncLines, StdinChunks, stdin
from kapok.errors import AuthError, ConnectionLostError
from kapok.tasks import cancel_and_wait

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["SECRET_ENV", "consume", "produce"]

SECRET_ENV = "KAPOK_SECRET"  # also named in kapok.cli
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT: the shell's code for "ended by Ctrl-C"
REDRAW_S = 0.1  # the progress line's refresh interval


def produce(args: argparse.Namespace) -> int:
    show = _show_progress(args.progress, data=sys.stdin)
    return _run(_Produce(args, stdin(), sys.stderr, show), sys.stderr)


def consume(args: argparse.Namespace) -> int:
    show = _show_progress(args.progress, data=sys.stdout)
    return _run(_Consume(args, sys.stdout.buffer, sys.stderr, show), sys.stderr)


class _Job(Protocol):
    def run(self) -> Coroutine[Any, Any, int]: ...

    def interrupted(self) -> str: ...


def _run(job: _Job, stderr: TextIO) -> int:
    """Run ``job`` on a new event loop. At the first SIGINT asyncio cancels it (the job
    closes its client on the way out) and raises ``KeyboardInterrupt`` here."""
    try:
        return asyncio.run(job.run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(job.interrupted(), file=stderr)
        return EXIT_INTERRUPTED


def _secret(args: argparse.Namespace) -> str:
    secret: str = args.secret if args.secret is not None else os.environ.get(SECRET_ENV, "test")
    return secret


def _key_refused(exc: AuthError) -> AuthError:
    return AuthError(f"{exc.message} (the key: --secret, else ${SECRET_ENV}, else 'test')")


async def _start(client: Producer | Consumer) -> None:
    try:
        await client.start()
    except AuthError as exc:
        raise _key_refused(exc) from None


def _per_node(stats: Stats, field: str) -> list[str]:
    return [f"  {name}: {getattr(node, field)}" for name, node in sorted(stats.per_node.items())]


# ---------------------------------------------------------------- produce


class _Produce:
    """One ``kapok produce``: stdin's lines into a producer, then the summary. A refused
    key ends it at once (every message would be refused the same way)."""

    def __init__(self, args: argparse.Namespace, source: StdinChunks, stderr: TextIO, show: bool) -> None:
        self.args = args
        self.source = source
        self.stderr = stderr
        self.show = show
        self.stats = Stats()  # the producer's, once there is one
        self.first_error: BaseException | None = None
        self.refused: AuthError | None = None
        self.stopped: str | None = None  # the interrupted line, counted when the interrupt came

    def interrupted(self) -> str:
        if self.stopped is None:
            s = self.stats
            pending = s.sent - s.confirmed - s.failed
            self.stopped = (
                f"kapok produce: interrupted: sent {s.sent}, confirmed {s.confirmed}, pending {pending}"
            )
        return self.stopped

    async def run(self) -> int:
        args = self.args
        producer = Producer(
            args.seed, topic=args.topic, secret=_secret(args), protocol=args.protocol,
            balance=args.balance, publish_timeout_s=args.timeout, name="kapok-produce",
        )  # fmt: skip
        self.stats = producer.stats
        await _start(producer)
        try:
            async with _live(self._view() if self.show else None, self.stderr):
                await self._send_lines(producer)
                await producer.flush()
            self._check_refused()
        except asyncio.CancelledError:
            self.interrupted()  # counted now: the close fails what is still pending
            raise
        finally:
            await producer.close()  # at once: after flush() nothing is left to wait for
        return self._report()

    async def _send_lines(self, producer: Producer) -> None:
        lines = AsyncLines(self.source)
        key, delay_s = self.args.key, self.args.delay
        while (chunk := await lines.chunks()) is not None:
            for line in chunk:
                future = await producer.send(line, key=key, delay_s=delay_s)
                future.add_done_callback(self._note)
            self._check_refused()

    def _note(self, future: asyncio.Future[str]) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is None:
            return
        self.first_error = self.first_error or exc
        if isinstance(exc, AuthError) and self.refused is None:
            self.refused = _key_refused(exc)
            self.source.abort(self.refused)  # a read waiting for the next line ends now

    def _check_refused(self) -> None:
        if self.refused is not None:
            raise self.refused

    def _report(self) -> int:
        stats, stderr = self.stats, self.stderr
        print(
            f"kapok produce: sent {stats.sent}, confirmed {stats.confirmed}, retried {stats.retried}, "
            f"failed {stats.failed}", file=stderr,
        )  # fmt: skip
        print("confirmed per node:", *_per_node(stats, "confirmed"), sep="\n", file=stderr)
        if stats.confirmed != stats.sent:
            first = f": {self.first_error}" if self.first_error else ""
            print(
                f"kapok: error: {stats.sent - stats.confirmed} message(s) not confirmed{first}", file=stderr
            )
            return EXIT_ERROR
        return 0

    def _view(self) -> _View:
        stats = self.stats
        return _View(
            "kapok produce",
            ("sent {task.fields[sent]:,}", "confirmed {task.completed:,.0f}"),
            lambda: {"completed": stats.confirmed, "sent": stats.sent},
        )


# ---------------------------------------------------------------- consume


class _Consume:
    """One ``kapok consume``: messages to stdout, each acked after its line was written."""

    def __init__(self, args: argparse.Namespace, stdout: BinaryIO, stderr: TextIO, show: bool) -> None:
        self.args = args
        self.stdout = stdout
        self.stderr = stderr
        self.show = show
        self.stats = Stats()  # the consumer's, once there is one
        self.done = 0  # lines written

    def interrupted(self) -> str:
        return f"kapok consume: interrupted: received {self.done}, acked {self.stats.acked}"

    async def run(self) -> int:
        args = self.args
        consumer = Consumer(
            args.seed, topic=args.topic, group=args.group, key=args.key, prefetch=args.prefetch,
            secret=_secret(args), protocol=args.protocol, name="kapok-consume",
        )  # fmt: skip
        self.stats = consumer.stats
        await _start(consumer)
        try:
            async with _live(self._view() if self.show else None, self.stderr):
                await self._take(consumer)
        finally:
            await consumer.close()
        return self._report()

    async def _take(self, consumer: Consumer) -> None:
        wanted: int | None = self.args.count
        while wanted is None or self.done < wanted:
            try:
                first = await consumer.get(self.args.timeout)
            except TimeoutError:
                return
            batch: list[Message] = [first]
            limit = consumer.buffered if wanted is None else min(consumer.buffered, wanted - self.done - 1)
            batch += [await consumer.get() for _ in range(limit)]  # what is here: one write
            self.stdout.write(b"".join(m.data + b"\n" for m in batch))
            self.stdout.flush()
            self.done += len(batch)
            for msg in batch:
                # A node that went away delivers it (and we write it) again.
                with contextlib.suppress(ConnectionLostError):
                    await msg.ack()

    def _report(self) -> int:
        done, wanted, stderr = self.done, self.args.count, self.stderr
        print(f"kapok consume: {done} message(s)", file=stderr)
        print("received per node:", *_per_node(self.stats, "received"), sep="\n", file=stderr)
        if wanted is not None and done < wanted:
            timeout = self.args.timeout
            print(f"kapok: error: got {done} of {wanted} messages before {timeout:g} s passed without one",
                  file=stderr)  # fmt: skip
            return EXIT_ERROR
        return 0

    def _view(self) -> _View:
        return _View(
            "kapok consume",
            ("received {task.completed:,.0f}", *(["of {task.total:,.0f}"] if self.args.count else [])),
            lambda: {"completed": self.done},
            total=self.args.count,
        )


# ---------------------------------------------------------------- progress


def _show_progress(flag: bool | None, *, data: TextIO) -> bool:
    """``--progress`` / ``--no-progress``, else: stderr is a terminal and the data is not."""
    if flag is not None:
        return flag
    return _isatty(sys.stderr) and not _isatty(data)


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # closed
        return False


@dataclasses.dataclass(frozen=True)
class _View:
    """What the live line shows: ``label``, then ``texts`` (rich ``TextColumn`` formats of
    ``counts()``: ``completed`` is what the rate counts, the rest are the task's fields),
    a bar if the ``total`` is known, the rate and the time so far."""

    label: str
    texts: tuple[str, ...]
    counts: Callable[[], dict[str, Any]]
    total: int | None = None


@contextlib.asynccontextmanager
async def _live(view: _View | None, stderr: TextIO) -> AsyncIterator[None]:
    """While the body runs, ``view`` redrawn on stderr every ``REDRAW_S`` (on this loop,
    so no thread writes to stderr); erased at the end (``transient``). None: nothing."""
    if view is None:
        yield
        return
    progress = _progress(stderr, view)
    task = progress.add_task(view.label, total=view.total, **view.counts())

    async def redraw() -> None:
        while True:
            progress.update(task, **view.counts())
            progress.refresh()
            await asyncio.sleep(REDRAW_S)

    with progress:
        redrawing = asyncio.get_running_loop().create_task(redraw())
        try:
            yield
        finally:
            await cancel_and_wait(redrawing)


def _progress(stderr: TextIO, view: _View) -> Progress:
    """rich's progress display of ``view`` on ``stderr``, drawn even when stderr is not a
    terminal (``--progress`` asked for it). rich is imported only when a display is wanted."""
    from rich import progress as rp
    from rich.console import Console
    from rich.text import Text

    class Rate(rp.ProgressColumn):
        def render(self, task: rp.Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} msg/s" if speed else "– msg/s", style="progress.data.speed")

    columns: list[rp.ProgressColumn] = [rp.SpinnerColumn(), rp.TextColumn("[bold]{task.description}")]
    columns += [rp.TextColumn(text) for text in view.texts]
    columns += [rp.BarColumn()] if view.total is not None else []
    columns += [Rate(), rp.TimeElapsedColumn()]
    return rp.Progress(
        *columns, console=Console(file=stderr, force_terminal=True),
        auto_refresh=False, transient=True, redirect_stdout=False,
    )  # fmt: skip
