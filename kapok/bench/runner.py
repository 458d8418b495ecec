"""Run the matrix fsync policy × workload × protocol, one fresh node per case."""

from __future__ import annotations

from kapok.bench.harness import CaseFailed, Harness, Options, Progress
from kapok.bench.nodes import LocalNode, Node, RemoteNode
from kapok.bench.report import Row
from kapok.bench.workloads import WORKLOADS

__all__ = ["run"]


def run(options: Options, progress: Progress) -> list[Row]:
    harness = Harness(options, progress)
    rows: list[Row] = []
    fsyncs = options.fsyncs if options.url is None else ("-",)
    for fsync in fsyncs:
        for workload in options.workloads:
            for protocol in options.protocols:
                rows += _case(harness, workload, protocol, fsync)
    progress.clear()
    return rows


def _case(h: Harness, workload: str, protocol: str, fsync: str) -> list[Row]:
    o = h.options
    label = f"{workload} {protocol} fsync={fsync}"
    if workload == "recovery" and o.url is not None:
        h.progress.line(f"kapok bench: {label}: skipped (needs a node the bench starts, not --url)")
        return []
    h.begin(label)
    node: Node | None = None
    try:
        node = RemoteNode(o.url, o.node_pid) if o.url is not None else LocalNode(fsync, h.node_sets())
        rows = WORKLOADS[workload](h, node, protocol)
    except Exception as exc:  # one failed case is a row, the others still run
        message = str(exc) if isinstance(exc, CaseFailed) else f"{type(exc).__name__}: {exc}"
        message = " ".join(message.split())
        h.progress.line(f"kapok bench: {label}: FAILED: {message}")
        return [Row(workload=workload, protocol=protocol, fsync=fsync, ok=False, error=message)]
    finally:
        if node is not None:
            node.close()
    for row in rows:
        rate = f"{row.msgs_per_s:,.0f} msg/s" if row.msgs_per_s is not None else row.notes
        h.progress.done(f"kapok bench: {row.label()}: {rate}")
    return rows
