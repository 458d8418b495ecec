"""The load processes: one producer process and one consumer process per case.

Each runs its clients as tasks on one event loop (uvloop when installed), in a process of
its own, separate from the node and from each other, like the peer benchmark's producer and
consumer. The orchestrator talks to them through a ``multiprocessing`` queue:

    ("ready", role, None)       the clients are connected (consumers: subscribed)
    ("result", role, {...})     counts, times (``time.monotonic()``, one clock machine-wide),
                                CPU seconds of the process, latency percentiles
    ("error", role, "text")     what went wrong; the orchestrator fails the case with it

and each role bumps a shared counter (messages confirmed / consumed) for the progress line.
Every wait is bounded by ``spec.deadline``; a run that reaches it reports ``timed_out``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from kapok.bench.clients import Consumer, Gauge, Producer, Tally
from kapok.bench.consumers import CompatConsumer, NativeConsumer
from kapok.bench.producers import CompatProducer, NativeProducer
from kapok.bench.report import percentiles

__all__ = ["RoleSpec", "child_main"]


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """What one load process does (picklable: it crosses into a spawned process)."""

    role: str  # "producer" | "consumer"
    protocol: str  # "native" | "kapokmq"
    ws_url: str
    key: str
    topic: str
    deadline: float  # time.monotonic() by which the process gives up
    clients: int = 1  # connections in this process
    messages: int = 0  # producer: total over its clients; consumer: per tally (see fanout)
    size: int = 100
    batch: int = 100
    window: int = 1000  # unconfirmed messages per producer connection
    prefetch: int = 1000
    rate: float = 0.0  # producer: msg/s for a paced (latency) run; 0 = as fast as the window allows
    roundtrip: float = 0.0  # producer: seconds of one message in flight at a time (0 = not a round trip)
    fanout: bool = False  # consumer: every connection gets every message (own group each)
    group_prefix: str = ""  # consumer, native fanout: group names
    latency: bool = False  # consumer: record end-to-end latency from the payload's stamp
    name: str = "bench"
    client: str = "raw"  # producer: "raw" (the minimal clients) or "library" (kapok.client.Producer)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def child_main(spec: RoleSpec, queue: Any, gauge: Gauge) -> None:
    """Entry point of a spawned load process."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            result = runner.run(_run(spec, queue, gauge))
        queue.put(("result", spec.role, result))
    except BaseException as exc:  # report anything; never leave the orchestrator waiting
        queue.put(("error", spec.role, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__))


async def _run(spec: RoleSpec, queue: Any, gauge: Gauge) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        if spec.role == "producer":
            return await _produce(spec, session, queue, gauge)
        return await _consume(spec, session, queue, gauge)


def _remaining(spec: RoleSpec) -> float:
    return max(0.001, spec.deadline - time.monotonic())


def _shares(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


async def _produce(
    spec: RoleSpec, session: aiohttp.ClientSession, queue: Any, gauge: Gauge
) -> dict[str, Any]:
    producers: list[Producer] = []
    for i in range(spec.clients):
        name = f"{spec.name}-p{i}"
        common = (spec.ws_url, spec.key, spec.topic, name, spec.size)
        if spec.client == "library":
            from kapok.bench.library import LibraryProducer  # the client package loads only here

            inflight = max(1, spec.window // spec.batch)
            producers.append(LibraryProducer(
                *common, protocol=spec.protocol, batch=spec.batch, inflight=inflight, gauge=gauge
            ))  # fmt: skip
        elif spec.protocol == "native":
            producers.append(NativeProducer(
                *common, window=spec.window, gauge=gauge, batch=spec.batch, reader=not spec.roundtrip
            ))  # fmt: skip
        else:
            producers.append(
                CompatProducer(*common, window=spec.window, gauge=gauge, reader=not spec.roundtrip)
            )
    result: dict[str, Any] = {"timed_out": False}
    try:
        async with asyncio.timeout(_remaining(spec)):
            await asyncio.gather(*(p.connect(session) for p in producers))
        queue.put(("ready", spec.role, None))
        cpu0 = time.process_time()
        t0 = time.monotonic()
        samples: list[int] = []
        try:
            async with asyncio.timeout(_remaining(spec)):
                if spec.roundtrip > 0:
                    until = min(spec.deadline, t0 + spec.roundtrip)
                    shares = _shares(spec.messages, len(producers))
                    await asyncio.gather(
                        *(p.roundtrip(n, until, samples) for p, n in zip(producers, shares, strict=True))
                    )
                elif spec.rate > 0:
                    await asyncio.gather(
                        *(p.paced(spec.messages, spec.rate, spec.deadline) for p in producers)
                    )
                else:
                    shares = _shares(spec.messages, len(producers))
                    await asyncio.gather(*(p.burst(n) for p, n in zip(producers, shares, strict=True)))
        except TimeoutError:
            result["timed_out"] = True
        t_last = max(p.window.t_last for p in producers)
        result.update(
            t0=t0,
            t1=t_last or time.monotonic(),
            confirmed=sum(p.window.confirmed for p in producers),
            cpu_s=time.process_time() - cpu0,
        )
        if spec.roundtrip > 0:
            result.update(percentiles(samples), samples=len(samples))
        return result
    finally:
        for p in producers:
            with contextlib.suppress(Exception):
                await p.close()


async def _all_done(tallies: list[Tally]) -> None:
    for tally in tallies:
        await tally.done.wait()


async def _consume(
    spec: RoleSpec, session: aiohttp.ClientSession, queue: Any, gauge: Gauge
) -> dict[str, Any]:
    consumers: list[Consumer] = []
    for i in range(spec.clients):
        name = f"{spec.name}-c{i}"
        if spec.protocol == "native":
            group = f"{spec.group_prefix}{i}" if spec.fanout else None
            consumers.append(
                NativeConsumer(
                    spec.ws_url, spec.key, spec.topic, name, gauge, prefetch=spec.prefetch, group=group
                )
            )
        else:
            consumers.append(CompatConsumer(spec.ws_url, spec.key, spec.topic, name, gauge))
    if spec.fanout:
        tallies = [Tally(spec.messages) for _ in consumers]
    else:
        shared = Tally(spec.messages)
        tallies = [shared for _ in consumers]
    latencies: list[int] | None = [] if spec.latency else None
    tasks: list[asyncio.Task[None]] = []
    result: dict[str, Any] = {"timed_out": False}
    try:
        async with asyncio.timeout(_remaining(spec)):
            await asyncio.gather(*(c.connect(session) for c in consumers))
        queue.put(("ready", spec.role, None))
        cpu0 = time.process_time()
        tasks = [asyncio.create_task(c.run(t, latencies)) for c, t in zip(consumers, tallies, strict=True)]
        unique = list({id(t): t for t in tallies}.values())
        all_done = asyncio.create_task(_all_done(unique))
        try:
            async with asyncio.timeout(_remaining(spec)):
                waits: list[asyncio.Future[Any]] = [all_done, *tasks]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            result["timed_out"] = True
        if not all_done.done():
            all_done.cancel()
            for task in tasks:  # a client that stopped early says why
                failure = task.exception() if task.done() and not task.cancelled() else None
                if failure is not None:
                    raise failure
        result.update(
            got=sum(t.got for t in unique),
            per_client=[t.got for t in unique],
            t_first=min((t.t_first for t in unique if t.got), default=0.0),
            t_last=max(t.t_last for t in unique),
            cpu_s=time.process_time() - cpu0,
        )
        if latencies is not None:
            result.update(percentiles(latencies), samples=len(latencies))
        return result
    finally:
        for task in tasks:
            task.cancel()
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.close()
