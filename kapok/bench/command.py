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
    for name in ("messages", "size", "batch", "inflight", "prefetch", "fanout", "clients", "backlog"):
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
        sets=tuple(args.overrides),
        replicas=_replicas(args),
    )


def _replicas(args: argparse.Namespace) -> tuple[str, ...]:
    replicas = _expand(args.replica, REPLICAS, "none", "replica")
    if args.url is not None and replicas != ("none",):
        raise ConfigError("--replica starts a slave beside a node the bench starts, not with --url")
    return replicas


def _summary(options: Options, date: str) -> str:
    target = options.url or "a fresh local node per case"
    return (
        f"kapok bench {__version__}, {date}, {target}: N={options.messages:,}, {options.size} B payloads, "
        f"batch {options.batch} × {options.inflight} in flight, prefetch {options.prefetch}"
    )


def run_command(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    progress = Progress()
    rows: list[Row] = run(options, progress)
    if args.json:
        opts: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(options).items()}
        print(json.dumps(document(rows, opts, __version__, date), indent=1))
    else:
        print(_summary(options, date))
        print()
        print(format_table(rows))
    sys.stdout.flush()
    return 0 if rows and all(row.ok for row in rows) else 1
