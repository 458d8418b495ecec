"""What every workload uses: the options, the progress line, and ``run_roles`` which starts
the consumer and producer processes, waits for them with a hard deadline and reads the
node's CPU and RSS around the measured window."""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue as queue_mod
import secrets
import sys
import time
from typing import Any, TextIO

from kapok.bench.nodes import Node
from kapok.bench.report import Row
from kapok.bench.roles import RoleSpec, child_main

__all__ = ["FANOUT_TOPIC", "CaseFailed", "Harness", "Options", "Progress", "RoleRun"]

# KapokMQ clients cannot name a group: fanout needs a pub/sub topic, where every connection
# gets a group of its own. Nodes the bench starts get this topic as push_type 2; a node
# targeted with --url needs `mq.topics.bench_fanout.push_type: 2` for the kapokmq fanout case.
FANOUT_TOPIC = "bench_fanout"
GRACE_S = 15.0  # beyond the children's own deadline, before they are terminated


class CaseFailed(Exception):
    """A case could not be measured; the message is the row's error."""


@dataclasses.dataclass(frozen=True)
class Options:
    workloads: tuple[str, ...]
    protocols: tuple[str, ...]
    fsyncs: tuple[str, ...]
    url: str | None = None
    node_pid: int | None = None
    key: str = "test"
    messages: int = 100_000
    size: int = 100
    batch: int = 100
    inflight: int = 10
    prefetch: int = 1000
    rate: float = 2000.0
    seconds: float = 10.0
    fanout: int = 4
    clients: int = 100
    backlog: int = 100_000
    timeout: float = 180.0
    minutes: float = 10.0  # soak: how long the mixed load runs
    topics: int = 5000  # scrape: topics on the node
    sets: tuple[str, ...] = ()
    replicas: tuple[str, ...] = ("none",)  # none, async, sync: a slave started beside each node
    rounds: int = 1  # every case this many times, interleaved (medians in the summary)
    peers: tuple[tuple[str, str], ...] = ()  # (name, HTTP URL): KapokMQ servers run beside Kapok
    peer_pid: int | None = None  # the peer's local PID, for its CPU and RSS
    peer_cmd: str = ""  # the shell command that runs the peer: started and stopped per case


class Progress:
    """One updating status line on stderr when it is a terminal; permanent lines otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._width = 0
        self._last = 0.0

    def show(self, text: str, *, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def line(self, text: str) -> None:
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """A finished case: the updating line on a terminal, a line of its own otherwise."""
        if self.tty:
            self.show(text, force=True)
        else:
            self.line(text)

    def clear(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


@dataclasses.dataclass
class RoleRun:
    producer: dict[str, Any]
    consumer: dict[str, Any] | None
    node_cpu_s: float | None
    rss_before: int | None
    rss_after: int | None


def _check_alive(procs: dict[str, Any], got: dict[tuple[str, str], Any], results: Any) -> None:
    for role, proc in procs.items():
        if not proc.is_alive() and ("result", role) not in got and results.empty():
            raise CaseFailed(f"the {role} process exited (code {proc.exitcode}) without a result")


def _cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


class Harness:
    def __init__(self, options: Options, progress: Progress) -> None:
        self.options = options
        self.progress = progress
        self.ctx = multiprocessing.get_context("spawn")
        self.nonce = secrets.token_hex(3)
        self.deadline = 0.0
        self.label = ""
        self.round = 1

    def begin(self, label: str) -> None:
        """A new case: its label and the deadline every wait of it is bounded by."""
        self.label = label
        self.deadline = time.monotonic() + self.options.timeout
        self.progress.show(f"{label}: starting", force=True)

    def topic(self, workload: str) -> str:
        """A topic of its own per workload and round (a peer or a ``--url`` node keeps them)."""
        suffix = f"_r{self.round}" if self.round > 1 else ""
        return f"bench_{workload}_{self.nonce}{suffix}"

    def node_sets(self) -> list[str]:
        """``--set`` overrides of every node the bench starts (the user's ``--set`` win)."""
        return [
            f"mq.prefetch={self.options.prefetch}",
            f"mq.topics.{FANOUT_TOPIC}.push_type=2",
            *self.options.sets,
        ]

    def spec(self, role: str, protocol: str, node: Node, topic: str, **fields: Any) -> RoleSpec:
        o = self.options
        base: dict[str, Any] = {
            "size": o.size,
            "batch": o.batch,
            "window": o.batch * o.inflight,
            "prefetch": o.prefetch,
            "name": f"bench-{self.nonce}",
        }
        base.update(fields)
        return RoleSpec(role, protocol, node.ws_url, o.key, topic, self.deadline, **base)

    def run_roles(
        self, node: Node, producer: RoleSpec, consumer: RoleSpec | None = None, consumed_target: int = 0
    ) -> RoleRun:
        """Consumer first (until subscribed), then the producer; both until they report."""
        ctx = self.ctx
        results: Any = ctx.Queue()
        gauges = {"producer": ctx.Value("q", 0, lock=False), "consumer": ctx.Value("q", 0, lock=False)}
        procs: dict[str, Any] = {}
        got: dict[tuple[str, str], Any] = {}
        published_target = producer.messages
        started = time.monotonic()

        def status() -> str:
            text = f"{self.label}: published {gauges['producer'].value:,}/{published_target:,}"
            if consumer is not None:
                text += f"  consumed {gauges['consumer'].value:,}/{consumed_target:,}"
            return text + f"  {time.monotonic() - started:.0f} s"

        def start(spec: RoleSpec) -> None:
            proc = ctx.Process(
                target=child_main, args=(spec, results, gauges[spec.role]), name=f"kapok-bench-{spec.role}"
            )
            proc.daemon = True
            proc.start()
            procs[spec.role] = proc

        def wait_for(keys: set[tuple[str, str]]) -> None:
            while not keys <= got.keys():
                if time.monotonic() > self.deadline + GRACE_S:
                    raise CaseFailed(
                        f"timed out after {self.options.timeout:.0f} s ({status().split(': ', 1)[1]})"
                    )
                self.progress.show(status())
                try:
                    kind, role, value = results.get(timeout=0.2)
                except queue_mod.Empty:
                    _check_alive(procs, got, results)
                    continue
                if kind == "error":
                    raise CaseFailed(f"{role}: {value}")
                got[(kind, role)] = value

        try:
            if consumer is not None:
                start(consumer)
                wait_for({("ready", "consumer")})
            cpu0, rss0 = node.cpu_s(), node.rss_bytes()
            start(producer)
            wanted = {("result", "producer")} | ({("result", "consumer")} if consumer is not None else set())
            wait_for(wanted)
            cpu1, rss1 = node.cpu_s(), node.rss_bytes()
        except BaseException:
            for proc in procs.values():  # a failed case: stop our own children at once
                if proc.is_alive():
                    proc.terminate()
            raise
        finally:
            for proc in procs.values():  # by their handles, never by name
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
            results.close()
        run = RoleRun(
            got[("result", "producer")], got.get(("result", "consumer")), _cpu_delta(cpu0, cpu1), rss0, rss1
        )
        self._check_timeouts(run, published_target, consumed_target)
        return run

    def _check_timeouts(self, run: RoleRun, published: int, consumed: int) -> None:
        parts = []
        if run.producer.get("timed_out"):
            parts.append(f"{run.producer.get('confirmed', 0):,} of {published:,} confirmed")
        if run.consumer is not None and run.consumer.get("timed_out"):
            parts.append(f"{run.consumer.get('got', 0):,} of {consumed:,} consumed")
        if parts:
            raise CaseFailed(f"timed out after {self.options.timeout:.0f} s: {', '.join(parts)}")

    def row(self, workload: str, protocol: str, node: Node, run: RoleRun | None, **fields: Any) -> Row:
        row = Row(workload=workload, protocol=protocol, fsync=node.fsync, round=self.round, **fields)
        if run is not None:
            row.node_cpu_s = run.node_cpu_s
            row.node_rss_bytes = run.rss_after
            row.producer_cpu_s = run.producer.get("cpu_s")
            if run.consumer is not None:
                row.consumer_cpu_s = run.consumer.get("cpu_s")
        return row
