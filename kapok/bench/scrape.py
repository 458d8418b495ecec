"""``kapok bench --workload scrape``: what scrapers of ``/metrics`` cost a node's real clients.

One node with ``--topics`` topics (5,000 by default; each made by publishing one message to
it). A producer publishes with one message in flight, paced at ``PUBLISH_RATE`` a second,
and records each publish's time from send to confirmation. Three phases of ``--seconds``
each, side by side in one run, on the same node:

A  no scrapers;
B  ``SCRAPERS`` scrapers without the key, each polling ``/metrics`` as fast as it answers;
C  as many with the key (``Authorization: Bearer <--key>``).

Each phase is a row: the producer's p50 / p99 / max ms, the scrapes served (and their
statuses: a node with ``metrics.require_key`` answers B's with 401), the renders the node
made (``kapok_metrics_renders_total``, when the node counts them) and the node's CPU; B and
C also give their p50 and p99 ÷ A's. The goal (issue 25): B's and C's p50 within 3× A's.
The producer and the scrapers run in processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from typing import Any

import aiohttp

from kapok.bench.clients import BenchError, Producer
from kapok.bench.harness import CaseFailed, Harness
from kapok.bench.nodes import Node
from kapok.bench.producers import CompatProducer, NativeProducer
from kapok.bench.report import Row, percentiles
from kapok.bench.roles import _loop_factory
from kapok.protocol.native import decode_frame, encode_pub

__all__ = ["PHASES", "PUBLISH_RATE", "SCRAPERS", "scrape"]

PUBLISH_RATE = 200.0  # the producer's publishes a second, one in flight
SCRAPERS = 8
FILL_BATCH = 500  # topics made per pub frame
PHASES = (
    ("A", "no scrapers", None),
    ("B", f"{SCRAPERS} scrapers without the key", False),
    ("C", f"{SCRAPERS} scrapers with the key", True),
)
GOAL = 3.0  # B's and C's p50 ÷ A's
_RENDERS = re.compile(rb"^kapok_metrics_renders_total (\S+)$", re.M)


# ---------------------------------------------------------------- in the load processes


def _run(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def publisher_main(ws_url: str, key: str, topic: str, protocol: str, seconds: float, queue: Any) -> None:
    """A spawned process: paced publishes for ``seconds``; puts ("result", {...}) or ("error", text)."""
    try:
        queue.put(("result", _run(_publish(ws_url, key, topic, protocol, seconds))))
    except BaseException as exc:
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


async def _publish(ws_url: str, key: str, topic: str, protocol: str, seconds: float) -> dict[str, Any]:
    gauge = _NoGauge()
    args = (ws_url, key, topic, "bench-scrape-producer", 100, 1, gauge)
    producer: Producer = (
        NativeProducer(*args, batch=1, reader=False)
        if protocol == "native"
        else CompatProducer(*args, reader=False)
    )
    samples: list[int] = []
    async with aiohttp.ClientSession() as session:
        await producer.connect(session)
        try:
            t0 = time.monotonic()
            until = t0 + seconds
            sent = 0
            while time.monotonic() < until:
                sent += 1
                await asyncio.sleep(max(0.0, t0 + sent / PUBLISH_RATE - time.monotonic()))
                await producer.roundtrip(len(samples) + 1, until, samples)
            elapsed = time.monotonic() - t0
        finally:
            with contextlib.suppress(Exception):
                await producer.close()
    return {"confirmed": len(samples), "elapsed_s": elapsed, **percentiles(samples)}


class _NoGauge:
    value = 0


def scrapers_main(http_url: str, headers: dict[str, str], clients: int, stop: Any, queue: Any) -> None:
    """A spawned process: ``clients`` scrapers polling ``/metrics`` until ``stop`` is set;
    puts ("ready", {}) once the first scrape is answered, then ("result", {...})."""
    try:
        queue.put(("result", _run(_scrape(http_url, headers, clients, stop, queue))))
    except BaseException as exc:
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


async def _scrape(
    http_url: str, headers: dict[str, str], clients: int, stop: Any, queue: Any
) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    bytes_read = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal bytes_read
        while not stop.is_set():
            try:
                async with session.get(http_url + "/metrics", headers=headers) as resp:
                    bytes_read += len(await resp.read())
                    statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1
                    if sum(statuses.values()) == 1:
                        queue.put(("ready", {}))  # the phase's producer starts now
            except (aiohttp.ClientError, TimeoutError):
                statuses["error"] = statuses.get("error", 0) + 1
                await asyncio.sleep(0.01)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.monotonic()
        await asyncio.gather(*(one(session) for _ in range(clients)))
        elapsed = time.monotonic() - t0
    return {
        "scrapes": sum(statuses.values()),
        "statuses": statuses,
        "bytes": bytes_read,
        "elapsed_s": elapsed,
    }


# ---------------------------------------------------------------- the orchestrator


def _fill_topics(node: Node, key: str, prefix: str, count: int) -> None:
    """Make ``count`` topics ``<prefix><i>``, one message each, through native ``pub`` frames."""

    async def fill() -> None:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                node.ws_url + "/v1/ws?client=bench-scrape-fill", headers={"Authorization": f"Bearer {key}"}
            ) as ws,
        ):
            for start in range(0, count, FILL_BATCH):
                msgs = [
                    {"topic": f"{prefix}{i}", "data": "x"}
                    for i in range(start, min(count, start + FILL_BATCH))
                ]
                await ws.send_bytes(encode_pub(start, msgs))
                frame = decode_frame((await ws.receive(timeout=60)).data)
                if frame.get("op") != "puback":
                    raise BenchError(f"the node refused the topics: {frame}")

    _run(fill())


def _renders(node: Node, key: str) -> float | None:
    """The node's ``kapok_metrics_renders_total`` (None: it does not count them)."""
    request = urllib.request.Request(node.http_url + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        match = _RENDERS.search(resp.read())
    return float(match.group(1)) if match else None


def _wait(h: Harness, queue: Any, procs: list[Any], what: str) -> dict[str, Any]:
    while True:
        try:
            kind, value = queue.get(timeout=0.2)
        except Exception:  # queue.Empty
            if time.monotonic() > h.deadline:
                raise CaseFailed(f"timed out waiting for the {what}") from None
            if not any(p.is_alive() for p in procs):
                raise CaseFailed(f"the {what} process exited without a result") from None
            continue
        if kind == "error":
            raise CaseFailed(f"{what}: {value}")
        result: dict[str, Any] = value
        return result


def _phase(
    h: Harness, node: Node, protocol: str, topic: str, keyed: bool | None
) -> tuple[dict[str, Any], ...]:
    o = h.options
    ctx = h.ctx
    results: Any = ctx.Queue()
    scraped: Any = ctx.Queue()
    stop = ctx.Event()
    procs: list[Any] = []
    try:
        if keyed is not None:
            headers = {"Authorization": f"Bearer {o.key}"} if keyed else {}
            args = (node.http_url, headers, SCRAPERS, stop, scraped)
            scrapers = ctx.Process(target=scrapers_main, args=args, name="kapok-bench-scrapers", daemon=True)
            scrapers.start()
            procs.append(scrapers)
            # The phase begins once they scrape: a spawned process takes a while to start.
            _wait(h, scraped, procs, "scrapers to start")
        renders0, cpu0 = _renders(node, o.key), node.cpu_s()
        work = (node.ws_url, o.key, topic, protocol, o.seconds, results)
        publisher = ctx.Process(target=publisher_main, args=work, name="kapok-bench-producer", daemon=True)
        publisher.start()
        procs.append(publisher)
        pub = _wait(h, results, [publisher], "producer")
        cpu1, renders1 = node.cpu_s(), _renders(node, o.key)
        stop.set()
        scr = _wait(h, scraped, procs[:1], "scrapers") if keyed is not None else {}
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    node_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    renders = None if renders0 is None or renders1 is None else renders1 - renders0
    return pub, scr, {"node_cpu_s": node_cpu, "renders": renders}


def scrape(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    h.progress.show(f"{h.label}: making {o.topics:,} topics", force=True)
    _fill_topics(node, o.key, f"bench_scrape_{h.nonce}_", o.topics)
    topic = h.topic("scrape")
    rows: list[Row] = []
    base: dict[str, Any] = {}
    for name, what, keyed in PHASES:
        h.progress.show(f"{h.label}: phase {name}, {what}", force=True)
        pub, scr, node_side = _phase(h, node, protocol, topic, keyed)
        if not pub.get("confirmed"):
            raise CaseFailed(f"phase {name}: no publish was confirmed")
        row = h.row("scrape", protocol, node, None, variant=f"{name}: {what}", messages=pub["confirmed"])
        row.msgs_per_s = pub["confirmed"] / pub["elapsed_s"]
        row.wall_s = pub["elapsed_s"]
        row.p50_ms, row.p99_ms, row.max_ms = pub.get("p50_ms"), pub.get("p99_ms"), pub.get("max_ms")
        row.node_cpu_s = node_side["node_cpu_s"]
        row.node_rss_bytes = node.rss_bytes()
        row.extra.update(topics=o.topics, publish_rate=PUBLISH_RATE, renders=node_side["renders"])
        notes = [f"{o.topics:,} topics, {PUBLISH_RATE:g} publishes/s, one in flight"]
        if keyed is None:
            base = pub
        else:
            per_s = scr["scrapes"] / max(scr["elapsed_s"], 1e-9)
            row.extra.update(
                scrapes=scr["scrapes"], scrape_statuses=scr["statuses"], scrape_bytes=scr["bytes"]
            )
            p50, p99 = pub["p50_ms"] / base["p50_ms"], pub["p99_ms"] / base["p99_ms"]
            row.extra.update(p50_ratio=p50, p99_ratio=p99)
            statuses = ", ".join(f"{k}: {v:,}" for k, v in sorted(scr["statuses"].items()))
            notes = [
                f"p50 ÷ A = {p50:.2f} (goal ≤ {GOAL:g}), p99 ÷ A = {p99:.2f}",
                f"{scr['scrapes']:,} scrapes ({per_s:,.0f}/s; {statuses})",
            ]
        if node_side["renders"] is not None:
            notes.append(f"{node_side['renders']:.0f} renders")
        row.notes = "; ".join(notes)
        rows.append(row)
    return rows
