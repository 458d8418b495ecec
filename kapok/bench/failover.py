"""Failover trials on real ``kapok serve`` processes: a fault under load, and a count.

    python -m kapok.bench.failover --runs 20 --mode sync --profile fast
    python -m kapok.bench.failover --runs 10 --scenario term --witness
    python -m kapok.bench.failover --runs 5 --mode async --profile lan --scenario kill

Each run starts a master and its slave (gossip on, ``--profile`` timings; with
``--witness`` a third node, the witness that lets a lone node of the pair go on), a
producer that publishes with confirmations to whichever node of the pair takes producers,
and a consumer that acks every message, on the native protocol. Once ``--messages`` are
confirmed the fault of ``--scenario`` strikes:

``kill``        SIGKILL of the master (the slave takes over)
``term``        SIGTERM of the master (a graceful stop: it hands over, once)
``kill-slave``  SIGKILL of the slave (with a witness, the master confirms alone)
``pause``       SIGSTOP of the master for 3 failover timeouts, then SIGCONT
``isolate``     the master cut from everyone (gossip and link) for 3 failover timeouts
``busy``        a CPU hog (4 spinning processes) for ``--busy-s`` seconds while the load
                runs: no node is killed, so any takeover is a spurious one (counted)

The run ends when the consumer has seen every confirmed message, or after a deadline.
Per run: takeover time (from the fault to the slave's "now the active master" line),
the write gap (from the fault to the first confirmation after it), confirmed, lost
(confirmed and never delivered), duplicates (delivered more than once: expected for
unacked messages), the slave's lag the master reported just before the fault, and, from
every node's ``/health`` polled every 50 ms, the polls that saw both nodes active and the
longest stretch with neither. A benchmark and an acceptance tool, not a test:
``tests/e2e/test_failover.py`` runs it on a few runs and asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from kapok.bench.failover_clients import (
    AUTH,
    PATIENCE_S,
    TOPIC,
    Tally,
    Watch,
    confirmed_after,
    consume,
    produce,
)
from kapok.launch import NodeProcess, cluster_sets, start_node, stop_all
from kapok.testing.pair import start_pair, state_of

__all__ = ["Outcome", "failover_trial", "main"]

DEADLINE_S = 30.0
_ACTIVE_LINE = "now the active master"
SCENARIOS = ("kill", "term", "kill-slave", "pause", "isolate", "busy")
HOGS = 4  # busy: processes spinning on the CPU (two per core on a 2-core machine)


@dataclass
class Outcome:
    mode: str
    profile: str
    scenario: str = "kill"
    takeover_s: float | None = None
    write_gap_s: float | None = None  # from the fault to the first confirmation after it
    stop_s: float | None = None  # term: from SIGTERM to the master's exit
    both_active: int = 0  # /health polls that saw both nodes of the pair active
    no_active_s: float = 0.0  # the longest stretch with neither node active
    tracebacks: int = 0  # in every node's output: there must be none
    takeovers: int = 0  # "now the active master" lines after the fault, on both nodes
    confirmed: int = 0
    from_slave: int = 0  # confirmed messages the consumer had not seen when the master died
    delivered: int = 0  # distinct messages the consumer saw
    duplicates: int = 0
    lost: int = 0
    lag_records_before_kill: int | None = None


def _active_times(node: NodeProcess, since: float, until: float = math.inf) -> list[float]:
    """When the node logged that it became the active master, between ``since`` and ``until``
    (unix times)."""
    times = (
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in node.output.splitlines()
        if _ACTIVE_LINE in line
    )
    return [at for at in times if since <= at <= until]


def active_at(node: NodeProcess, since: float) -> float | None:
    """When the node first logged that it became the active master, after ``since``."""
    times = _active_times(node, since)
    return times[0] if times else None


async def _drained(http: aiohttp.ClientSession, nodes: list[NodeProcess]) -> bool:
    """The pair has settled and holds nothing more for the consumer: of its running nodes one
    is active and says the topic has no live message (each one was acked), and every other
    follows it in sync (a returning master has set aside what it alone had by then)."""
    running = [node for node in nodes if node.alive()]
    states = await asyncio.gather(*(asyncio.to_thread(state_of, node) for node in running))
    active = [node for node, state in zip(running, states, strict=True) if state.get("active") is True]
    following = all(
        state.get("active") is True or (state.get("link_up") is True and state.get("in_sync") is True)
        for state in states
    )
    if len(active) != 1 or not following:
        return False
    timeout = aiohttp.ClientTimeout(total=2.0)
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError):
        async with http.get(active[0].url + "/v1/topics", headers=AUTH, timeout=timeout) as resp:
            topics = (await resp.json())["topics"]
        return sum(int(t.get("live", 0)) for t in topics if t.get("name") == TOPIC) == 0
    return False


def _faulty(path: Path) -> tuple[str, ...]:
    return ("-m", "kapok.faulty", "--fault-file", str(path), "--")


async def failover_trial(
    base: Path,
    *,
    mode: str = "sync",
    profile: str = "fast",
    failover_timeout_s: float = 1.0,
    messages: int = 2000,
    sets: tuple[str, ...] = (),
    scenario: str = "kill",
    witness: bool = False,
    logs: Path | None = None,
    busy_s: float = 600.0,
    rate: float = 0.0,
) -> Outcome:
    """One run: publish and consume, strike ``scenario`` once ``messages`` are confirmed,
    follow the pair through it, and count."""
    out = Outcome(mode, profile, scenario)
    nodes: list[NodeProcess] = []
    if witness:
        nodes.append(start_node(base / "witness", *cluster_sets(profile), "server.name=witness"))
    faults = base / "master.faults.json"
    faults.parent.mkdir(parents=True, exist_ok=True)
    faults.write_text("{}")
    try:
        master, slave = start_pair(
            base, mode=mode, profile=profile, failover_timeout_s=failover_timeout_s, sets=sets,
            seeds=tuple(n.gossip_addr for n in nodes),
            launchers=(_faulty(faults) if scenario == "isolate" else ("-m", "kapok"), ("-m", "kapok")),
        )  # fmt: skip
    except BaseException:
        stop_all(nodes)
        raise
    nodes += [master, slave]
    urls = [master.url, slave.url]
    tally, stop, producing, watch = Tally(), asyncio.Event(), asyncio.Event(), Watch()
    seen_before: set[str] = set()
    struck_at = ended_at = math.inf
    try:
        timeout = aiohttp.ClientTimeout(total=None, connect=PATIENCE_S, sock_read=PATIENCE_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            tasks = [
                asyncio.create_task(produce(http, urls, tally, producing, rate)),
                asyncio.create_task(consume(http, urls, tally, stop)),
                asyncio.create_task(watch.run(http, urls, stop)),
            ]
            deadline = time.monotonic() + DEADLINE_S
            lag: int | None = None
            while len(tally.confirmed) < messages and time.monotonic() < deadline:
                state = await asyncio.to_thread(state_of, master)
                lag = (state.get("lag") or {}).get("records", lag)
                await asyncio.sleep(0.05)
            out.lag_records_before_kill = lag
            seen_before = set(tally.seen)
            struck_at, struck_mono = time.time(), time.monotonic()
            await _strike(scenario, master, slave, faults, failover_timeout_s, out, busy_s)
            # The write gap: from the fault to the first confirmation of a batch sent after it.
            # A sync pair without a witness that lost a node for good takes no writes (it
            # cannot tell a cut from a crash): nothing to wait for.
            lone = mode == "sync" and not witness and scenario in ("kill", "kill-slave")
            give_up = time.monotonic() + (0.0 if lone else DEADLINE_S)
            while time.monotonic() < give_up and not confirmed_after(tally, struck_mono):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            after = confirmed_after(tally, struck_mono)
            out.write_gap_s = round(min(after) - struck_mono, 3) if after else None
            producing.set()
            await asyncio.wait_for(tasks.pop(0), DEADLINE_S)
            # Until every confirmed message was seen, or the pair has settled with nothing
            # more to deliver: what never came then is counted as lost below.
            give_up = time.monotonic() + DEADLINE_S
            while not tally.confirmed <= tally.seen.keys() and time.monotonic() < give_up:
                if await _drained(http, [master, slave]):
                    break
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
            ended_at = time.time()  # what the nodes log from here on is the teardown's
    except BaseException:
        producing.set()
        stop.set()
        raise
    finally:
        stop_all(nodes)
        if logs is not None:
            _keep_logs(logs, nodes)
    out.takeovers = sum(len(_active_times(node, struck_at, ended_at)) for node in (master, slave))
    became_active = active_at(slave, struck_at)
    out.takeover_s = None if became_active is None else round(became_active - struck_at, 3)
    out.tracebacks = sum(node.output.count("Traceback") for node in nodes)
    out.both_active, out.no_active_s = watch.both_active, round(watch.no_active_s, 3)
    out.confirmed = len(tally.confirmed)
    out.from_slave = len(tally.confirmed - seen_before)
    out.delivered = len(tally.seen)
    out.duplicates = sum(n - 1 for n in tally.seen.values())
    out.lost = len(tally.confirmed - tally.seen.keys())
    return out


def _keep_logs(folder: Path, nodes: list[NodeProcess]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (folder / f"{node.workdir.name}.log").write_text(node.output)


async def _strike(
    scenario: str,
    master: NodeProcess,
    slave: NodeProcess,
    faults: Path,
    failover_timeout_s: float,
    out: Outcome,
    busy_s: float,
) -> None:
    if scenario == "kill":
        master.kill()
    elif scenario == "kill-slave":
        slave.kill()
    elif scenario == "term":
        began = time.monotonic()
        await asyncio.to_thread(master.stop, 30.0)
        out.stop_s = round(time.monotonic() - began, 3)
    elif scenario == "pause":
        os.kill(master.pid, signal.SIGSTOP)
        await asyncio.sleep(3 * failover_timeout_s)
        os.kill(master.pid, signal.SIGCONT)
    elif scenario == "isolate":
        await asyncio.to_thread(faults.write_text, '{"isolate": true}')
        await asyncio.sleep(3 * failover_timeout_s)
        await asyncio.to_thread(faults.write_text, "{}")
    elif scenario == "busy":
        spin = "while True: pass"
        hogs = [await asyncio.create_subprocess_exec(sys.executable, "-c", spin) for _ in range(HOGS)]
        try:
            await asyncio.sleep(busy_s)
        finally:
            for hog in hogs:
                hog.kill()
                await hog.wait()
    else:
        raise ValueError(f"unknown scenario {scenario!r}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    times = [o.takeover_s for o in outcomes if o.takeover_s is not None]
    gaps = [o.write_gap_s for o in outcomes if o.write_gap_s is not None]
    stops = [o.stop_s for o in outcomes if o.stop_s is not None]
    return {
        "scenario": outcomes[0].scenario if outcomes else None,
        "runs": len(outcomes),
        "write_gap_p50_s": statistics.median(gaps) if gaps else None,
        "write_gap_max_s": max(gaps) if gaps else None,
        "runs_without_writes_after": sum(o.write_gap_s is None for o in outcomes),
        "stop_max_s": max(stops) if stops else None,
        "both_active_polls": sum(o.both_active for o in outcomes),
        "tracebacks": sum(o.tracebacks for o in outcomes),
        "takeovers": sum(o.takeovers for o in outcomes),
        "no_active_max_s": max((o.no_active_s for o in outcomes), default=0.0),
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
    prog = "python -m kapok.bench.failover"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--profile", choices=("fast", "lan"), default="fast")
    parser.add_argument("--failover-timeout-s", type=float, default=None, help="default: 1 (fast), 3 (lan)")
    parser.add_argument("--messages", type=int, default=2000, help="confirmed before the fault")
    parser.add_argument("--scenario", choices=SCENARIOS, default="kill")
    parser.add_argument("--witness", action="store_true", help="a third node: the pair's witness")
    parser.add_argument("--busy-s", type=float, default=600.0, help="busy: how long the CPU hog runs")
    parser.add_argument("--rate", type=float, default=0.0, help="messages a second (0: as fast as it goes)")
    parser.add_argument("--fsync", default="always", choices=("always", "interval", "never"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep every node's output here, a folder a run")
    args = parser.parse_args(argv)
    timeout = args.failover_timeout_s or (1.0 if args.profile == "fast" else 3.0)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="kapok-trial-") as tmp:
        for i in range(args.runs):
            outcome = asyncio.run(
                failover_trial(
                    Path(tmp) / f"run{i}", mode=args.mode, profile=args.profile, failover_timeout_s=timeout,
                    messages=args.messages, sets=(f"storage.fsync={args.fsync}",),
                    scenario=args.scenario, witness=args.witness, busy_s=args.busy_s, rate=args.rate,
                    logs=None if args.logs is None else args.logs / f"run{i}",
                )
            )  # fmt: skip
            outcomes.append(outcome)
            print(json.dumps(asdict(outcome)), file=sys.stderr, flush=True)
    result = summary(outcomes)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
