"""Run the matrix round × workload × fsync policy × replica × protocol, one fresh node per
case (and, with a replica mode, a fresh slave following it, caught up before the load
starts); with ``--peer``, each workload of each round also runs against the peer right
after Kapok's cases of it, so both see the same minutes of a shared machine."""

from __future__ import annotations

import os
import time

from kapok.bench.harness import CaseFailed, Harness, Options, Progress
from kapok.bench.nodes import LocalNode, Node, PeerProcess, RemoteNode
from kapok.bench.report import Row
from kapok.bench.workloads import WORKLOADS
from kapok.launch import get_json

__all__ = ["run"]


# What a KapokMQ peer cannot run: recovery needs a node the bench starts; KapokMQ sets
# pub/sub per node, not per topic (fanout); client measures Kapok's client library.
PEER_SKIPS = {"recovery", "fanout", "client", "scrape"}


def run(options: Options, progress: Progress) -> list[Row]:
    harness = Harness(options, progress)
    rows: list[Row] = []
    fsyncs = options.fsyncs if options.url is None else ("-",)
    for round_no in range(1, options.rounds + 1):
        harness.round = round_no
        for workload in options.workloads:
            for fsync in fsyncs:
                for replica in options.replicas:
                    for protocol in options.protocols:
                        load = os.getloadavg()[0]
                        case = _case(harness, workload, protocol, fsync, replica)
                        rows += _mark(case, "kapok", round_no, load)
            for name, url in options.peers:
                load = os.getloadavg()[0]
                rows += _mark(_peer_case(harness, workload, name, url), name, round_no, load)
    progress.clear()
    return rows


def _mark(rows: list[Row], system: str, round_no: int, load: float) -> list[Row]:
    for row in rows:
        row.system, row.round, row.load_avg_1m = system, round_no, load
    return rows


def _peer_case(h: Harness, workload: str, name: str, url: str) -> list[Row]:
    label = f"{workload} {name} (peer)"
    if workload in PEER_SKIPS:
        if h.round == 1:
            h.progress.line(f"kapok bench: {label}: skipped (runs against Kapok only)")
        return []
    h.begin(label)
    command = h.options.peer_cmd
    peer: RemoteNode | None = None
    try:
        peer = PeerProcess(url, command) if command else RemoteNode(url, h.options.peer_pid)
        rows = WORKLOADS[workload](h, peer, "kapokmq")
    except Exception as exc:
        return [_failed(h, label, workload, "kapokmq", "-", exc)]
    finally:
        if peer is not None:
            peer.close()
    for row in rows:
        h.progress.done(f"kapok bench: {name} {row.label()}: {_headline(row)}")
    return rows


def _failed(h: Harness, label: str, workload: str, protocol: str, fsync: str, exc: Exception) -> Row:
    message = str(exc) if isinstance(exc, CaseFailed) else f"{type(exc).__name__}: {exc}"
    message = " ".join(message.split())
    h.progress.line(f"kapok bench: {label}: FAILED: {message}")
    return Row(workload=workload, protocol=protocol, fsync=fsync, ok=False, error=message)


def _headline(row: Row) -> str:
    return f"{row.msgs_per_s:,.0f} msg/s" if row.msgs_per_s is not None else row.notes


def _case(h: Harness, workload: str, protocol: str, fsync: str, replica: str) -> list[Row]:
    o = h.options
    slave_note = "" if replica == "none" else f"{replica} slave"
    label = f"{workload} {protocol} fsync={fsync}" + (f" ({slave_note})" if slave_note else "")
    if workload == "soak" and protocol != o.protocols[0]:
        return []  # the soak runs both protocols at once
    if workload in ("recovery", "backlog", "soak") and replica != "none":
        h.progress.line(f"kapok bench: {label}: skipped (measures one node alone)")
        return []
    if workload == "recovery" and o.url is not None:
        h.progress.line(f"kapok bench: {label}: skipped (needs a node the bench starts, not --url)")
        return []
    h.begin(label)
    node: Node | None = None
    slave: LocalNode | None = None
    try:
        if o.url is not None:
            node = RemoteNode(o.url, o.node_pid)
        else:
            mode = [] if replica == "none" else [f"replication.mode={replica}"]
            node = LocalNode(fsync, [*h.node_sets(), *mode])
            if replica != "none":
                slave = _start_slave(h, node, fsync, replica)
        rows = WORKLOADS[workload](h, node, protocol)
    except Exception as exc:  # one failed case is a row, the others still run
        failed = _failed(h, label, workload, protocol, fsync, exc)
        failed.variant = slave_note
        return [failed]
    finally:
        if slave is not None:
            slave.close()
        if node is not None:
            node.close()
    for row in rows:
        row.variant = ", ".join(v for v in (row.variant, slave_note) if v)
    for row in rows:
        h.progress.done(f"kapok bench: {row.label()}: {_headline(row)}")
    return rows


def _start_slave(h: Harness, master: LocalNode, fsync: str, mode: str) -> LocalNode:
    """A slave of ``master`` in a fresh directory, caught up before the case's load starts."""
    sets = [*h.node_sets(), "replication.role=slave", f"replication.master={master.http_url}",
            f"replication.mode={mode}"]  # fmt: skip
    slave = LocalNode(fsync, sets)
    try:
        while not (get_json(master.http_url, "/replication/state", key=h.options.key) or {}).get("link_up"):
            if time.monotonic() > h.deadline:
                raise CaseFailed("the slave did not connect to its master")
            time.sleep(0.05)
    except BaseException:
        slave.close()
        raise
    return slave
