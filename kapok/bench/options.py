"""The command line of ``kapok bench``: argparse only, so that building the ``kapok``
parser loads none of the benchmark's modules."""

from __future__ import annotations

import argparse

__all__ = ["add_options"]


def add_options(command: argparse.ArgumentParser) -> None:
    """The options of ``kapok bench``."""
    add = command.add_argument
    add(
        "--workload",
        action="append",
        metavar="NAME",
        help="publish, e2e, latency, roundtrip, fanout, clients, backlog, recovery, client or all "
        "(repeatable; default all); soak (not in all): --minutes of mixed load with a kill -9; "
        "scrape (not in all): a producer's latency while 8 scrapers poll /metrics",
    )
    add("--protocol", default="native", help="native, kapokmq or both (default native)")
    add("--fsync", default="always", help="storage.fsync of the started nodes: always, interval, never, all")
    add(
        "--replica",
        action="append",
        metavar="MODE",
        help="none, async, sync or all: run each case with no slave, or a slave in that replication mode "
        "started beside the node (repeatable; default none)",
    )
    add("--url", help="target this running node (http://host:port) instead of starting one per case")
    add(
        "--peer",
        action="append",
        metavar="kapokmq=URL",
        help="also run every case against this KapokMQ server (its HTTP base URL), interleaved with "
        "Kapok's, and print the ratios",
    )
    add("--peer-pid", type=int, help="with --peer: the peer's local PID, to read its CPU and RSS")
    add(
        "--peer-cmd",
        metavar="COMMAND",
        help="with --peer: a shell command that runs the peer in the foreground (exec the server); "
        "the bench starts a fresh peer for each of its cases and stops it after",
    )
    add("--rounds", type=int, default=1, help="run every case this many times, interleaved (default 1)")
    add("--node-pid", type=int, help="with --url: the node's local PID, to read its CPU and RSS")
    add("--key", default="test", help="the node's mq.secret_key (default test)")
    add("--messages", type=int, default=100_000, help="messages per run (default 100000)")
    add("--size", type=int, default=100, help="payload bytes (default 100)")
    add("--batch", type=int, default=100, help="native: messages per pub frame (default 100)")
    add(
        "--inflight",
        type=int,
        default=10,
        help="pub frames unconfirmed (KapokMQ: batch × inflight msgs; default 10)",
    )
    add("--prefetch", type=int, default=1000, help="consumer prefetch (default 1000)")
    add("--rate", type=float, default=2000.0, help="latency: messages per second (default 2000)")
    add("--seconds", type=float, default=10.0, help="latency and roundtrip: duration (default 10)")
    add("--fanout", type=int, default=4, help="fanout: subscribers, each in its own group (default 4)")
    add("--clients", type=int, default=100, help="clients: producers and as many consumers (default 100)")
    add("--backlog", type=int, default=100_000, help="backlog / recovery: messages queued (default 100000)")
    add("--topics", type=int, default=5000, help="scrape: topics on the node (default 5000)")
    add("--minutes", type=float, default=10.0, help="soak: minutes of load (default 10; --rate msg/s)")
    add(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds a case may take before it fails (default 180)",
    )
    add(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="configuration override for the nodes the bench starts (repeatable)",
    )
    add("--json", action="store_true", help="print JSON instead of the table")
