"""The pure parts of `kapok bench`: percentiles, the table, option parsing, the compare summary."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kapok.bench.command import options_from_args
from kapok.bench.compare import format_report, kapok_groups, peer_groups
from kapok.bench.report import Row, format_table, percentiles
from kapok.bench.summary import format_summary, rows_of, summarize
from kapok.cli import _build_parser
from kapok.errors import ConfigError


def test_percentiles_nearest_rank_in_ms() -> None:
    samples = [i * 1_000_000 for i in range(1, 101)]  # 1..100 ms, shuffled order does not matter
    got = percentiles(list(reversed(samples)))
    assert got == {"p50_ms": 51.0, "p99_ms": 100.0, "max_ms": 100.0}
    assert percentiles([]) == {}


def test_table_has_one_line_per_row_and_shows_failures() -> None:
    rows = [
        Row("e2e", "native", "always", messages=10, msgs_per_s=12345.6, node_rss_bytes=2**20),
        Row("latency", "kapokmq", "never", p50_ms=0.25, p99_ms=1.5, max_ms=3.0),
        Row("fanout", "native", "always", ok=False, error="timed out after 5 s"),
    ]
    lines = format_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert "| e2e | native | always | 12,346 |" in lines[2] and "| 1.0 |" in lines[2]
    assert "| 0.25 | 1.50 | 3.00 |" in lines[3]
    assert "FAILED" in lines[4] and "timed out after 5 s" in lines[4]


def test_table_gives_cpu_per_message_of_node_and_load_and_the_machine_s_load() -> None:
    rows = [
        Row("e2e", "kapokmq", "never", messages=50_000, node_cpu_s=0.75, producer_cpu_s=0.4,
            consumer_cpu_s=0.3, load_avg_1m=1.234),
        Row("e2e", "native", "never", messages=0, node_cpu_s=0.5),  # no count: no rate per message
    ]  # fmt: skip
    header, _, first, second = format_table(rows).splitlines()
    assert "| node µs/msg | load µs/msg | load avg | notes |" in header
    assert "| 15.0 | 14.0 | 1.23 |" in first  # 0.75 s / 50,000; (0.4 + 0.3) s / 50,000
    assert second.endswith("| 0.50 |  |  |  |  |  |")


def _args(*argv: str) -> argparse.Namespace:
    return _build_parser().parse_args(["bench", *argv])


def test_options_expand_all_and_both() -> None:
    options = options_from_args(_args("--workload", "all", "--protocol", "both", "--fsync", "all"))
    assert options.workloads == (
        "publish", "e2e", "latency", "roundtrip", "fanout", "clients", "backlog", "recovery", "client"
    )  # fmt: skip
    assert options.protocols == ("native", "kapokmq")
    assert options.fsyncs == ("always", "interval", "never")
    options = options_from_args(
        _args("--workload", "e2e", "--workload", "publish,e2e", "--fsync", "interval,never")
    )
    assert options.workloads == ("e2e", "publish")
    assert options.fsyncs == ("interval", "never")
    assert options.protocols == ("native",)
    # The soak runs for minutes: only by name, never as part of "all".
    options = options_from_args(_args("--workload", "soak", "--minutes", "2.5"))
    assert options.workloads == ("soak",) and options.minutes == 2.5


@pytest.mark.parametrize(
    "argv",
    [
        ("--workload", "bogus"),
        ("--protocol", "amqp"),
        ("--fsync", "sometimes"),
        ("--messages", "0"),
        ("--url", "x"),
        ("--rounds", "0"),
        ("--peer", "nats=http://127.0.0.1:1"),
        ("--peer", "kapokmq"),
        ("--peer", "kapokmq=127.0.0.1:8611"),
        ("--peer", "kapokmq=http://a:1", "--peer", "kapokmq=http://b:1"),
        ("--peer-pid", "12"),
    ],
)
def test_options_reject_bad_values(argv: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        options_from_args(_args(*argv))


def test_compare_medians_and_ratios() -> None:
    kapok_docs = [
        {"rows": [{"workload": "e2e", "protocol": "native", "fsync": "always", "ok": True, "msgs_per_s": r}]}
        for r in (80_000, 100_000, 90_000)
    ]
    kapok_docs.append({"rows": [{"workload": "e2e", "protocol": "native", "fsync": "always", "ok": False}]})
    peers = [
        {"system": "nats", "mode": "e2e", "confirm": "batch", "durable": True, "msgs_per_s": 45_000},
        {"system": "nats", "mode": "e2e", "confirm": "batch", "durable": True, "msgs_per_s": 40_000},
        {"system": "nats", "mode": "e2e", "confirm": "batch", "durable": True, "msgs_per_s": 50_000},
        {"system": "nats", "mode": "e2e", "confirm": "sync", "durable": True, "msgs_per_s": 1},
        {"summary": True, "system": "nats", "mode": "e2e"},
    ]
    kapok = kapok_groups(kapok_docs)
    theirs = peer_groups(peers)
    assert kapok[("e2e", "kapok native fsync=always")].median("msgs_per_s") == 90_000
    assert theirs[("e2e", "nats durable")].median("msgs_per_s") == 45_000
    report = format_report(kapok, theirs)
    assert "| kapok native fsync=always | 2.00× |" in report


def test_peer_options() -> None:
    options = options_from_args(
        _args("--peer", "kapokmq=http://127.0.0.1:8611/", "--peer-pid", "7", "--rounds", "3")
    )
    assert options.peers == (("kapokmq", "http://127.0.0.1:8611"),)
    assert options.peer_pid == 7 and options.rounds == 3


def _row(system: str, workload: str, protocol: str, rate: float, **fields: float) -> Row:
    fsync = "never" if system == "kapok" else "-"
    return Row(workload, protocol, fsync, system=system, msgs_per_s=rate, **fields)  # type: ignore[arg-type]


def test_summary_medians_and_ratios_against_a_peer() -> None:
    rows = [
        _row("kapok", "e2e", "kapokmq", r, node_rss_bytes=100 * 2**20) for r in (40_000, 60_000, 50_000)
    ] + [_row("kapokmq", "e2e", "kapokmq", r, node_rss_bytes=200 * 2**20) for r in (20_000, 25_000, 30_000)]
    rows += [_row("kapok", "roundtrip", "native", 6_000, p50_ms=0.1, p99_ms=0.4)]
    rows += [_row("kapokmq", "roundtrip", "kapokmq", 5_000, p50_ms=0.2, p99_ms=0.5)]
    rows.append(Row("e2e", "kapokmq", "never", ok=False, error="timed out"))  # failures are left out
    summary = summarize(rows)
    groups = {(g["workload"], g["name"]): g for g in summary["groups"]}
    assert groups[("e2e", "kapok kapokmq fsync=never")]["msgs_per_s"] == 50_000
    assert groups[("e2e", "kapok kapokmq fsync=never")]["runs"] == 3
    assert groups[("e2e", "kapokmq")]["msgs_per_s"] == 25_000
    ratios = {(r["workload"], r["kapok"]): r for r in summary["ratios"]}
    assert set(ratios) == {("e2e", "kapok kapokmq fsync=never"), ("roundtrip", "kapok native fsync=never")}
    assert ratios[("e2e", "kapok kapokmq fsync=never")]["msgs_per_s"] == 2.0
    assert ratios[("e2e", "kapok kapokmq fsync=never")]["node_rss_bytes"] == 0.5
    assert ratios[("roundtrip", "kapok native fsync=never")]["p50_ms"] == 0.5
    text = format_summary(summary)
    assert "| e2e | kapok kapokmq fsync=never | kapokmq | 2.00× |  |  | 0.50× |" in text
    assert "| roundtrip | kapok native fsync=never | kapokmq | 1.20× | 0.50× | 0.80× |  |" in text
    table = format_table(rows).splitlines()
    assert table[0].startswith("| system | workload |")  # one round: no round column
    assert table[5].startswith("| kapokmq | e2e | kapokmq | - | 20,000 |")
    # The same from JSON documents (python -m kapok.bench.summary merges runs).
    docs = [{"rows": [dataclasses.asdict(row) | {"unknown": 1}]} for row in rows]
    merged = [row for doc in docs for row in rows_of(doc)]
    assert summarize(merged) == summary


def test_summary_is_empty_for_single_runs_without_a_peer() -> None:
    assert format_summary(summarize([_row("kapok", "e2e", "native", 1.0)])) == ""
