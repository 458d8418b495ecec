"""The ``kapok`` command (also ``python -m kapok``).

Each subcommand is a ``_cmd_<name>(args) -> int`` function registered in
``_build_parser``; heavy modules are imported inside it so that ``kapok version`` and
``--help`` stay instant. Errors never show a traceback: ``main`` turns them into one
line ``kapok: error: <message>`` on stderr and exit code 2 (usage or configuration)
or 1 (anything else the broker reports, such as a port already in use); Ctrl-C exits
with 130. The options of ``produce``, ``consume`` and ``analytics``, with the checks of
their values, are declared in ``kapok.cli_options``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from kapok import __version__
from kapok.bench.options import add_options as add_bench_options
from kapok.cli_options import add_analytics_options, add_consume_options, add_produce_options
from kapok.errors import ConfigError, KapokError

if TYPE_CHECKING:
    from kapok.config import Config
    from kapok.config.kapokmq import Note
    from kapok.node.seams import Seams

__all__ = ["main"]

PROG = "kapok"
DEFAULT_CONFIG_FILE = "application.yaml"
EXIT_ERROR = 1
EXIT_USAGE = 2  # also used for configuration errors, like argparse's usage errors
_Commands: TypeAlias = "argparse._SubParsersAction[_Parser]"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Kapok: a lightweight, clustered message broker.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run a broker node until SIGINT/SIGTERM")
    _config_options(serve)
    serve.set_defaults(func=_cmd_serve)

    importer = commands.add_parser(
        "import-kapokmq", help="load a KapokMQ data directory (MQDATA + WAL.log) into this node's storage"
    )
    importer.add_argument("source", metavar="DIR", help="the KapokMQ working directory")
    _config_options(importer)
    importer.set_defaults(func=_cmd_import)

    check = commands.add_parser(
        "check",
        help="validate a configuration and print its effective values (secrets hidden)",
        description="Load the configuration as `kapok serve` would (file, KAPOK_* variables, --set), check "
        "every key and the rules across keys, and print the effective values as YAML. Exit code 0, or "
        "one line on stderr and 2.",
    )
    _config_options(check)
    check.set_defaults(func=_cmd_check)

    config_commands = _group(commands, "config", "work with configuration files")
    convert = config_commands.add_parser(
        "convert", help="print the Kapok application.yaml equivalent to a KapokMQ application.yaml"
    )
    convert.add_argument("source", metavar="FILE", help="KapokMQ's application.yaml")
    convert.set_defaults(func=_cmd_config_convert)

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)

    bench = commands.add_parser(
        "bench",
        help="measure throughput, latency, memory and recovery of a node (see docs/benchmarks.md)",
        description="Start a node per case (or target --url) and run load processes against it; "
        "prints a table, or JSON with --json. Progress goes to stderr.",
    )
    add_bench_options(bench)
    bench.set_defaults(func=_cmd_bench)

    cluster_commands = _group(commands, "cluster", "look at a cluster through one of its nodes")
    nodes = cluster_commands.add_parser("nodes", help="list the members one node's gossip view holds")
    nodes.add_argument(
        "--seed", required=True, metavar="URL", help="any node's HTTP URL, e.g. http://127.0.0.1:8011"
    )
    nodes.add_argument("--json", action="store_true", help="print the JSON list instead of the table")
    nodes.set_defaults(func=_cmd_cluster_nodes)

    replication_commands = _group(commands, "replication", "look at or change a node's master/slave pairing")
    state = replication_commands.add_parser("state", help="the pair as one node sees it (role, epoch, lag)")
    state.add_argument("--url", required=True, help="the node's HTTP URL, e.g. http://127.0.0.1:8011")
    _secret_option(state)
    state.set_defaults(func=_cmd_replication, action="state")
    unpair = replication_commands.add_parser(
        "unpair", help="make a master forget its slave on purpose (it then confirms writes alone)"
    )
    unpair.add_argument("--url", required=True, help="the master's HTTP URL")
    _secret_option(unpair)
    unpair.set_defaults(func=_cmd_replication, action="unpair")
    promote = replication_commands.add_parser(
        "promote", help="make a slave lead its pair now (its master is gone for good)"
    )
    promote.add_argument("--url", required=True, help="the slave's HTTP URL")
    promote.add_argument(
        "--force", action="store_true", help="even a slave that was not in sync (may lose confirmed writes)"
    )
    _secret_option(promote)
    promote.set_defaults(func=_cmd_replication, action="promote")

    secret_note = (
        " The secret key: --secret, else $KAPOK_SECRET, else 'test'. Ctrl-C stops it with one line of"
        " counts on stderr and exit code 130."
    )
    for name, summary, about, add_options in (
        (
            "produce",
            "publish each line of stdin as one message; summary on stderr",
            "Publishes each line of stdin (without its line break) as one message through the client "
            "library, waits for every confirmation and prints sent / confirmed, per node, on stderr. "
            "Exit 0 only if every message was confirmed.",
            add_produce_options,
        ),
        (
            "consume",
            "write each message's payload as one line on stdout, acked after the write",
            "Subscribes on every active master and writes each payload as one line on stdout; a "
            "message is acked only after its line was written and flushed. Stops after --count "
            "messages or --timeout seconds without one.",
            add_consume_options,
        ),
    ):
        client_command = commands.add_parser(name, help=summary, description=about + secret_note)
        add_options(client_command)
        client_command.set_defaults(func=_cmd_client(name))

    local = commands.add_parser(
        "local-cluster",
        help="start a demo cluster on 127.0.0.1 until Ctrl-C",
        description="Starts N masters (and with --slaves one slave each) as real nodes on 127.0.0.1, "
        "each with a generated application.yaml under --dir, prints them, and stops them on Ctrl-C.",
    )
    local.add_argument("--masters", type=int, default=3, metavar="N", help="masters to start (default 3)")
    local.add_argument("--slaves", action="store_true", help="give every master a slave")
    local.add_argument("--dir", metavar="D", help="the nodes' folders go here (./kapok-cluster)")
    local.set_defaults(func=_cmd_local_cluster)

    analytics = commands.add_parser(
        "analytics",
        help="per-topic counts and delivery latency from the archive, on PySpark (see README: Analytics)",
        description="Run the analytics job over one or more nodes' archives: per topic × hour and × day "
        "counts, bytes, redelivery ratio and ack latency percentiles, as Parquet (hourly/, daily/, "
        "partitioned by day) and summary.json, which the console reads. Needs the analytics extra "
        "(pip install 'kapok[analytics]') and Java 17 or 21. Progress goes to stderr.",
    )
    add_analytics_options(analytics)
    analytics.set_defaults(func=_cmd_analytics)

    return parser


def _cmd_client(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from kapok.client import commands

        result: int = getattr(commands, name)(args)
        return result

    return run


def _cmd_local_cluster(args: argparse.Namespace) -> int:
    from kapok.local_cluster import run_local_cluster

    if args.masters < 1:
        raise ConfigError("--masters must be at least 1")
    return run_local_cluster(args.masters, args.slaves, args.dir)


def _secret_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--secret",
        default=os.environ.get("KAPOK_SECRET", "test"),
        help="the node's mq.secret_key (default: $KAPOK_SECRET, else test)",
    )


def _group(commands: _Commands, name: str, help: str) -> _Commands:
    """A command with subcommands of its own (``kapok cluster nodes``)."""
    group = commands.add_parser(name, help=help)
    dest = f"{name}_command"
    return group.add_subparsers(dest=dest, metavar="COMMAND", required=True, parser_class=_Parser)


def _config_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help=f"YAML configuration file (default: ./{DEFAULT_CONFIG_FILE} if present, else built-in defaults)",
    )
    command.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override one key, e.g. --set server.port=9011 (value read as YAML; repeatable)",
    )


def _load(args: argparse.Namespace) -> Config:
    """The configuration, and logging set up from it (a KapokMQ file's notes logged)."""
    from kapok.logs import setup_logging

    config, notes = _load_quietly(args)
    setup_logging(config)
    log = logging.getLogger("kapok.config")
    for note in notes:
        log.log(note.level, "%s", note.text)
    return config


def _load_quietly(args: argparse.Namespace) -> tuple[Config, list[Note]]:
    from kapok.config import load_config

    path: str | None = args.config
    if path is None and Path(DEFAULT_CONFIG_FILE).is_file():
        path = DEFAULT_CONFIG_FILE
    notes: list[Note] = []
    return load_config(path, overrides=args.overrides, env=os.environ, notes=notes), notes


def _cmd_check(args: argparse.Namespace) -> int:
    import yaml

    from kapok.cluster.node import swim_config
    from kapok.config import public_dict

    config, notes = _load_quietly(args)
    swim_config(config.cluster)  # the gossip timings' rules across keys (cluster.tuning)
    for note in notes:
        print(f"{PROG}: {note.text}", file=sys.stderr)
    print(yaml.safe_dump(public_dict(config), sort_keys=False, allow_unicode=True), end="")
    print(f"{PROG}: configuration OK (node {config.server.node_name})", file=sys.stderr)
    return 0


def _cmd_config_convert(args: argparse.Namespace) -> int:
    from kapok.config import convert_kapokmq_file

    print(convert_kapokmq_file(Path(args.source)), end="")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    import asyncio

    from kapok.storage.migrate import import_kapokmq

    summary = asyncio.run(import_kapokmq(_load(args), Path(args.source)))
    print(summary)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from kapok.bench.command import run_command

    return run_command(args)


def _cmd_analytics(args: argparse.Namespace) -> int:
    from kapok.analytics.command import run_command

    return run_command(args)


def _cmd_cluster_nodes(args: argparse.Namespace) -> int:
    import json

    from kapok.cluster.show import fetch_nodes, nodes_table

    rows = fetch_nodes(args.seed)
    print(json.dumps(rows, indent=2) if args.json else nodes_table(rows))
    return 0


def _cmd_replication(args: argparse.Namespace) -> int:
    import json

    from kapok.cluster.show import fetch_json

    if args.action == "unpair":
        state = fetch_json(args.url, "/replication/unpair", method="POST", key=args.secret)
    elif args.action == "promote":
        path = "/replication/promote" + ("?force=true" if args.force else "")
        state = fetch_json(args.url, path, method="POST", key=args.secret)
    else:
        state = fetch_json(args.url, "/replication/state", key=args.secret)
    print(json.dumps(state, indent=2))
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"{PROG} {__version__}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from kapok.node.runner import serve

    serve(_load(args), seams=args.seams)  # blocks until SIGINT or SIGTERM
    return 0


def main(argv: Sequence[str] | None = None, *, seams: Seams | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code.
    ``seams`` reach ``kapok serve``'s node (``kapok.faulty`` injects faults through them)."""
    parser = _build_parser()
    parser.set_defaults(seams=seams)
    try:
        args = parser.parse_args(argv)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        return EXIT_USAGE
    except ConfigError as exc:
        return _fail(exc.message, EXIT_USAGE)
    except KapokError as exc:
        return _fail(exc.message, EXIT_ERROR)
    except OSError as exc:
        return _fail(str(exc) or type(exc).__name__, EXIT_ERROR)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    one_line = " ".join(message.split())
    print(f"{PROG}: error: {one_line}", file=sys.stderr)
    return code
