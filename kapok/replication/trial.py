"""Failover trials on real ``kapok serve`` processes: kill -9 a master and count messages.

    python -m kapok.replication.trial --runs 20 --mode sync --profile fast
    python -m kapok.replication.trial --runs 5 --mode async --profile lan

Each run starts a master and its slave (gossip on, ``--profile`` timings), a producer
that publishes with confirmations and a consumer that acks every message, on the
native protocol. Once ``--messages`` are confirmed the master is killed with SIGKILL;
the consumer moves to the slave as soon as it takes over. The run ends when the
consumer has seen every confirmed message, or after a deadline. Per run: takeover time
(from the kill to the slave's "now the active master" log line), confirmed, lost
(confirmed and never delivered), duplicates (delivered more than once: expected for
unacked messages), and the slave's lag the master reported just before the kill. A
benchmark and an acceptance tool, not a test: ``tests/e2e/test_failover.py`` runs it on a
few runs and asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from kapok.launch import NodeProcess, cluster_sets, get_json, start_node, stop_all, wait_for

__all__ = ["Outcome", "failover_trial", "main", "start_pair", "state_of"]

SECRET = "test"
AUTH = {"Authorization": f"Bearer {SECRET}"}
TOPIC = "trial"
BATCH = 10
INFLIGHT = 4
DEADLINE_S = 30.0
# The consumer works this long per pushed frame before it acks, so a backlog of confirmed
# but undelivered messages has built up on the master when it is killed: those must come
# from the slave.
WORK_S = 0.01
_ACTIVE_LINE = "now the active master"


@dataclass
class Outcome:
    mode: str
    profile: str
    takeover_s: float | None = None
    confirmed: int = 0
    from_slave: int = 0  # confirmed messages the consumer had not seen when the master died
    delivered: int = 0  # distinct messages the consumer saw
    duplicates: int = 0
    lost: int = 0
    lag_records_before_kill: int | None = None


def start_pair(
    base: Path,
    *,
    mode: str,
    profile: str,
    failover_timeout_s: float,
    sets: tuple[str, ...] = (),
    seeds: tuple[str, ...] = (),
    launchers: tuple[Sequence[str], Sequence[str]] = (("-m", "kapok"), ("-m", "kapok")),
) -> tuple[NodeProcess, NodeProcess]:
    """A master and its slave, gossiping (through ``seeds``, else the master), the slave
    caught up. ``launchers`` start each (``kapok.faulty`` for fault injection)."""
    common = (f"replication.mode={mode}", f"replication.failover_timeout_s={failover_timeout_s}", *sets)
    master = start_node(
        base / "master", *cluster_sets(profile, seeds), "server.name=master", *common, launcher=launchers[0]
    )
    try:
        slave = start_node(
            base / "slave",
            *cluster_sets(profile, seeds or [master.gossip_addr]),
            "server.name=slave",
            "replication.role=slave",
            f"replication.master={master.url}",
            *common,
            launcher=launchers[1],
        )
    except BaseException:
        stop_all([master])
        raise
    try:
        wait_for(lambda: bool(state_of(master).get("link_up")), DEADLINE_S, 0.05)
    except BaseException:
        stop_all([master, slave])
        raise
    return master, slave


def state_of(node: NodeProcess | str) -> dict[str, Any]:
    """``GET /replication/state`` of a node; {} when it does not answer."""
    state: dict[str, Any] = get_json(node, "/replication/state") or {}
    return state


def active_at(node: NodeProcess, since: float) -> float | None:
    """When the node logged that it became the active master, after ``since`` (unix time)."""
    for line in node.output.splitlines():
        if _ACTIVE_LINE in line:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since:
                return at
    return None


@dataclass
class _Tally:
    confirmed: set[str] = field(default_factory=set)
    seen: dict[str, int] = field(default_factory=dict)  # payload -> deliveries


async def _produce(http: aiohttp.ClientSession, url: str, tally: _Tally, stop: asyncio.Event) -> None:
    """Publish numbered messages with ``INFLIGHT`` batches unconfirmed, until the node goes."""
    counter = itertools.count()
    pending: dict[int, list[str]] = {}
    with contextlib.suppress(aiohttp.ClientError, ConnectionError, asyncio.CancelledError):
        async with http.ws_connect(f"{url}/v1/ws", headers=AUTH) as ws:
            rid = 0
            while not stop.is_set():
                while len(pending) < INFLIGHT:
                    rid += 1
                    payloads = [f"m{next(counter)}" for _ in range(BATCH)]
                    pending[rid] = payloads
                    msgs = [{"data": p} for p in payloads]
                    await ws.send_json({"op": "pub", "id": rid, "topic": TOPIC, "msgs": msgs})
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    return
                frame = json.loads(msg.data)
                payloads = pending.pop(frame.get("id"), [])
                if frame.get("op") == "puback":
                    tally.confirmed.update(payloads)


async def _consume(http: aiohttp.ClientSession, urls: list[str], tally: _Tally, stop: asyncio.Event) -> None:
    """Subscribe on whichever node takes consumers; ack everything; move on when it goes."""
    while not stop.is_set():
        for url in urls:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                async with http.ws_connect(f"{url}/v1/ws", headers=AUTH) as ws:
                    await ws.send_json({"op": "sub", "id": 1, "topic": TOPIC, "prefetch": 200})
                    while not stop.is_set():
                        msg = await ws.receive(timeout=1.0)
                        if msg.type is not aiohttp.WSMsgType.TEXT:
                            break
                        frame = json.loads(msg.data)
                        if frame.get("op") != "msg":
                            continue
                        for m in frame["msgs"]:
                            tally.seen[m["data"]] = tally.seen.get(m["data"], 0) + 1
                        await asyncio.sleep(WORK_S)
                        codes = [m["code"] for m in frame["msgs"]]
                        await ws.send_json({"op": "ack", "sub": frame["sub"], "codes": codes})
        await asyncio.sleep(0.05)


async def failover_trial(
    base: Path,
    *,
    mode: str = "sync",
    profile: str = "fast",
    failover_timeout_s: float = 1.0,
    messages: int = 2000,
    sets: tuple[str, ...] = (),
) -> Outcome:
    """One run: publish and consume, kill -9 the master once ``messages`` are confirmed,
    follow the slave's takeover, and count."""
    out = Outcome(mode, profile)
    master, slave = start_pair(
        base, mode=mode, profile=profile, failover_timeout_s=failover_timeout_s, sets=sets
    )
    tally, stop = _Tally(), asyncio.Event()
    seen_before_kill: set[str] = set()
    try:
        async with aiohttp.ClientSession() as http:
            producer = asyncio.create_task(_produce(http, master.url, tally, stop))
            consumer = asyncio.create_task(_consume(http, [master.url, slave.url], tally, stop))
            deadline = time.monotonic() + DEADLINE_S
            lag: int | None = None
            while len(tally.confirmed) < messages and time.monotonic() < deadline:
                state = await asyncio.to_thread(state_of, master)
                lag = (state.get("lag") or {}).get("records", lag)
                await asyncio.sleep(0.05)
            out.lag_records_before_kill = lag
            seen_before_kill = set(tally.seen)
            killed_at = time.time()
            master.kill()
            await asyncio.wait_for(producer, DEADLINE_S)
            await asyncio.to_thread(
                wait_for, lambda: active_at(slave, killed_at) is not None, DEADLINE_S, 0.05
            )
            became_active = active_at(slave, killed_at)
            out.takeover_s = None if became_active is None else round(became_active - killed_at, 3)
            give_up = time.monotonic() + DEADLINE_S  # what never comes is counted as lost below
            while not tally.confirmed <= tally.seen.keys() and time.monotonic() < give_up:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(consumer, DEADLINE_S)
    finally:
        stop_all([master, slave])
    out.confirmed = len(tally.confirmed)
    out.from_slave = len(tally.confirmed - seen_before_kill)
    out.delivered = len(tally.seen)
    out.duplicates = sum(n - 1 for n in tally.seen.values())
    out.lost = len(tally.confirmed - tally.seen.keys())
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    times = [o.takeover_s for o in outcomes if o.takeover_s is not None]
    return {
        "runs": len(outcomes),
        "takeover_p50_s": statistics.median(times) if times else None,
        "takeover_p99_s": _percentile(times, 0.99) if times else None,
        "takeover_max_s": max(times) if times else None,
        "runs_without_loss": sum(o.lost == 0 for o in outcomes),
        "lost": sum(o.lost for o in outcomes),
        "lost_within_lag": all(o.lost <= (o.lag_records_before_kill or 0) for o in outcomes),
        "confirmed": sum(o.confirmed for o in outcomes),
        "from_slave": sum(o.from_slave for o in outcomes),
        "duplicates": sum(o.duplicates for o in outcomes),
    }


def main(argv: list[str] | None = None) -> int:
    prog = "python -m kapok.replication.trial"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--profile", choices=("fast", "lan"), default="fast")
    parser.add_argument("--failover-timeout-s", type=float, default=None, help="default: 1 (fast), 3 (lan)")
    parser.add_argument("--messages", type=int, default=2000, help="confirmed before the kill")
    parser.add_argument("--fsync", default="always", choices=("always", "interval", "never"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    timeout = args.failover_timeout_s or (1.0 if args.profile == "fast" else 3.0)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kapok-trial-") as tmp:
        for i in range(args.runs):
            outcome = asyncio.run(
                failover_trial(
                    Path(tmp) / f"run{i}", mode=args.mode, profile=args.profile, failover_timeout_s=timeout,
                    messages=args.messages, sets=(f"storage.fsync={args.fsync}",),
                )
            )  # fmt: skip
            outcomes.append(outcome)
            print(json.dumps(asdict(outcome)), file=sys.stderr, flush=True)
    result = summary(outcomes)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
