"""``kapok bench``: options → runs → table or JSON. The arguments are declared in
``kapok.cli`` (so ``kapok --help`` stays instant); this module is imported when the
command runs."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from kapok import __version__
from kapok.bench.harness import Options, Progress
from kapok.bench.report import Row, document, format_table
from kapok.bench.runner import run
from kapok.bench.summary import format_summary, summarize
from kapok.bench.workloads import LONG_WORKLOADS, WORKLOADS
from kapok.errors import ConfigError

__all__ = ["options_from_args", "run_command"]

PROTOCOLS = ("native", "kapokmq")
FSYNCS = ("always", "interval", "never")
REPLICAS = ("none", "async", "sync")


def _expand(
    values: list[str] | None, known: tuple[str, ...], default: str, what: str, not_all: tuple[str, ...] = ()
) -> tuple[str, ...]:
    chosen: list[str] = []
    for value in values or [default]:
        for item in value.split(","):
            names = tuple(k for k in known if k not in not_all) if item in ("all", "both") else (item,)
            for name in names:
                if name not in known:
                    raise ConfigError(f"unknown {what} {name!r}; expected one of {', '.join(known)} or all")
                if name not in chosen:
                    chosen.append(name)
    return tuple(chosen)


def options_from_args(args: argparse.Namespace) -> Options:
    for name in (
        "messages",
        "size",
        "batch",
        "inflight",
        "prefetch",
        "fanout",
        "clients",
        "backlog",
        "rounds",
        "topics",
    ):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1")
    for name in ("rate", "seconds", "timeout", "minutes"):
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name} must be positive")
    if args.url is not None and not args.url.startswith(("http://", "https://")):
        raise ConfigError("--url must be the node's HTTP base URL, e.g. http://127.0.0.1:8011")
    return Options(
        workloads=_expand(args.workload, tuple(WORKLOADS), "all", "workload", LONG_WORKLOADS),
        protocols=_expand([args.protocol], PROTOCOLS, "native", "protocol"),
        fsyncs=_expand([args.fsync], FSYNCS, "always", "fsync policy"),
        url=args.url,
        node_pid=args.node_pid,
        key=args.key,
        messages=args.messages,
        size=args.size,
        batch=args.batch,
        inflight=args.inflight,
        prefetch=args.prefetch,
        rate=args.rate,
        seconds=args.seconds,
        fanout=args.fanout,
        clients=args.clients,
        backlog=args.backlog,
        timeout=args.timeout,
        minutes=args.minutes,
        topics=args.topics,
        sets=tuple(args.overrides),
        replicas=_replicas(args),
        rounds=args.rounds,
        peers=_peers(args),
        peer_pid=args.peer_pid,
        peer_cmd=args.peer_cmd or "",
    )


PEER_KINDS = ("kapokmq",)


def _peers(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    peers: list[tuple[str, str]] = []
    for value in args.peer or []:
        kind, sep, url = value.partition("=")
        if not sep or kind not in PEER_KINDS:
            raise ConfigError(f"--peer must be kapokmq=URL (a KapokMQ server's HTTP base URL), got {value!r}")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--peer {kind}: the URL must start with http:// or https://, got {url!r}")
        if any(kind == name for name, _ in peers):
            raise ConfigError(f"--peer {kind} given twice")
        peers.append((kind, url.rstrip("/")))
    if args.peer_pid is not None and not peers:
        raise ConfigError("--peer-pid needs --peer")
    if args.peer_cmd and not peers:
        raise ConfigError("--peer-cmd needs --peer")
    if args.peer_cmd and args.peer_pid is not None:
        raise ConfigError("--peer-cmd starts the peer itself: give no --peer-pid")
    return tuple(peers)


def _replicas(args: argparse.Namespace) -> tuple[str, ...]:
    replicas = _expand(args.replica, REPLICAS, "none", "replica")
    if args.url is not None and replicas != ("none",):
        raise ConfigError("--replica starts a slave beside a node the bench starts, not with --url")
    return replicas


def _summary(options: Options, date: str) -> str:
    target = options.url or "a fresh local node per case"
    peers = "".join(f", against {name} at {url}" for name, url in options.peers)
    rounds = f", {options.rounds} interleaved rounds" if options.rounds > 1 else ""
    return (
        f"kapok bench {__version__}, {date}, {target}{peers}{rounds}: N={options.messages:,}, "
        f"{options.size} B payloads, batch {options.batch} × {options.inflight} in flight, "
        f"prefetch {options.prefetch}"
    )


def run_command(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    progress = Progress()
    rows: list[Row] = run(options, progress)
    summary = summarize(rows)
    if args.json:
        opts: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(options).items()}
        doc = document(rows, opts, __version__, date)
        doc["summary"] = summary
        print(json.dumps(doc, indent=1))
    else:
        print(_summary(options, date))
        print()
        print(format_table(rows))
        medians = format_summary(summary)
        if medians:
            print()
            print(medians)
    sys.stdout.flush()
    return 0 if rows and all(row.ok for row in rows) else 1
