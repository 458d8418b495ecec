"""The options of ``kapok produce``, ``kapok consume`` and ``kapok analytics``, and the
argparse types that check their values.

A bad value is a usage error (one line, exit 2) before anything runs. The ``kapok`` parser
is built on every call, ``--help`` and ``version`` included, so this module loads argparse
and the errors only; what a check needs beyond that it imports when it runs.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from kapok.errors import KapokError

__all__ = ["add_analytics_options", "add_consume_options", "add_produce_options"]


def _common_options(command: argparse.ArgumentParser) -> None:
    add = command.add_argument
    add(
        "--seed",
        action="append",
        required=True,
        type=_seed_url,
        metavar="URL",
        help="a node's HTTP URL, e.g. http://127.0.0.1:8011 (repeatable; any member will do)",
    )
    add("--topic", required=True, type=_name("topic"), help="the topic")
    add("--secret", default=None, help="the nodes' mq.secret_key (default: $KAPOK_SECRET, else 'test')")
    add(
        "--protocol",
        choices=("native", "kapokmq"),
        default="native",
        help="native (default) or kapokmq (KapokMQ's routes, for KapokMQ-compatible servers)",
    )
    add(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a live count and rate on stderr (default: when stderr is a terminal and the messages' "
        "stdin/stdout is not)",
    )


def add_produce_options(command: argparse.ArgumentParser) -> None:
    _common_options(command)
    add = command.add_argument
    add("--key", default="", type=_text("--key"), help="routing key of every message")
    add(
        "--delay",
        type=_delay,
        default=0.0,
        metavar="S",
        help="deliver each message S seconds later",
    )
    add(
        "--balance",
        choices=("random", "p2c", "key"),
        default="random",
        help="how messages are spread over the masters (default random)",
    )
    add(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="a message not confirmed within S seconds fails (default 30)",
    )


def add_consume_options(command: argparse.ArgumentParser) -> None:
    _common_options(command)
    add = command.add_argument
    add("--group", default=None, type=_name("group"), help="consumer group (default: the topic's default)")
    add(
        "--key",
        default=None,
        type=_text("--key"),
        metavar="PATTERN",
        help="routing-key pattern, e.g. 'orders.*'",
    )
    add("--count", type=_integer(1), default=None, metavar="N", help="stop after N messages")
    add(
        "--timeout",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="stop after S seconds without a message",
    )
    add(
        "--prefetch",
        type=_integer(1, MAX_PREFETCH),
        default=None,
        help="unacked messages per node (default: the node's)",
    )


# The option checks of produce and consume: a bad value is a usage error (one line, exit 2)
# before anything is sent, not a traceback or a refusal of every message by the nodes.
MAX_TEXT_CHARS = 255  # a routing key or key pattern (kapok.protocol.fields, kapok.core.routing)
MAX_PREFETCH = 1_000_000  # kapok.core.broker (Broker._capped)


def _seed_url(text: str) -> str:
    from urllib.parse import urlsplit

    url = text.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"expected an http(s) URL such as http://127.0.0.1:8011, got {text!r}"
        )
    return url


def _name(kind: str) -> Callable[[str], str]:
    """A topic or group name as the nodes accept it (their own check)."""

    def check(text: str) -> str:
        from kapok.core.broker import check_name

        try:
            return check_name(kind, text)
        except KapokError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    return check


def _text(option: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if len(text) > MAX_TEXT_CHARS:
            raise argparse.ArgumentTypeError(f"{option} is at most {MAX_TEXT_CHARS} characters")
        return text

    return check


def _delay(text: str) -> float:
    from kapok.protocol.native import MAX_DELAY_S

    return _finite_seconds(
        lambda s: 0 <= s <= MAX_DELAY_S, f"a number of seconds between 0 and {MAX_DELAY_S:.0f}"
    )(text)


def _integer(lo: int, hi: int | None = None) -> Callable[[str], int]:
    expected = f"an integer >= {lo}" if hi is None else f"an integer between {lo} and {hi}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _positive_seconds(text: str) -> float:
    return _finite_seconds(lambda s: s > 0, "a number of seconds > 0")(text)


def _finite_seconds(ok: Callable[[float], bool], expected: str) -> Callable[[str], float]:
    """A finite number (no nan, no inf) for which ``ok`` holds."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


def add_analytics_options(command: argparse.ArgumentParser) -> None:
    add = command.add_argument
    add(
        "--input",
        action="append",
        required=True,
        metavar="PATH",
        help="a node's storage.dir (its archive/ is read), an archive folder, files, a glob, or any URI "
        "Spark reads, such as hdfs://… (repeatable: several nodes' archives at once)",
    )
    add(
        "--output",
        metavar="DIR",
        help="where to write (a directory or a URI); default: <storage.dir>/analytics of the first "
        "--input that is a node's storage dir, where the console finds summary.json",
    )
    add(
        "--master",
        help="Spark master: local[*] (default, embedded; under spark-submit: its own), spark://host:port, "
        "yarn …",
    )
    add(
        "--conf",
        action="append",
        type=_spark_conf,
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable): spark.executor.memory=4g …",
    )
    add("--full", action="store_true", help="recompute every day, not only those of new archive files")
    add("--since", type=_duration, metavar="AGE", help="only events of the last AGE: 90s, 30m, 12h, 7d, 2w")
    add(
        "--window",
        choices=("minute", "hour", "day"),
        default="hour",
        help="the windows of the per-window tables (default hour: hourly/ and groups/)",
    )
    add("--watch", type=_seconds, metavar="SECONDS", help="run again every SECONDS until interrupted")


def _spark_conf(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE with a key, got {text!r}")
    return text


def _duration(text: str) -> float:
    from kapok.analytics.inputs import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value
