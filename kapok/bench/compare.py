"""Medians and ratios of Kapok against the peer benchmark (``build/bench-compare.sh``).

    python -m kapok.bench.compare --peers PEERS_RAW KAPOK_JSON...

``KAPOK_JSON`` are ``kapok bench --json`` documents (one per run; directories are searched
for ``kapok-*.json``); ``PEERS_RAW`` holds the peer benchmark's JSON lines (its ``--out``
file). Cases compared: ``e2e`` and ``publish`` (peers: ``--confirm batch``) and
``latency``. Throughput ratios are Kapok ÷ peer (above 1: Kapok is faster); latency ratios
are Kapok's p50 and p99 ÷ the peer's (below 1: Kapok is quicker).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Group", "format_report", "kapok_groups", "main", "peer_groups"]

CASES = ("e2e", "publish", "latency")


class Group:
    """The runs of one system configuration in one case, and their medians."""

    def __init__(self, case: str, name: str) -> None:
        self.case = case
        self.name = name
        self.runs: list[dict[str, Any]] = []

    def median(self, key: str) -> float | None:
        values = [float(r[key]) for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    def all_rates(self) -> list[float]:
        return [float(r["msgs_per_s"]) for r in self.runs if r.get("msgs_per_s") is not None]


def kapok_groups(documents: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Group]:
    groups: dict[tuple[str, str], Group] = {}
    for doc in documents:
        for row in doc.get("rows", []):
            if not row.get("ok") or row.get("workload") not in CASES:
                continue
            name = f"kapok {row['protocol']} fsync={row['fsync']}"
            groups.setdefault((row["workload"], name), Group(row["workload"], name)).runs.append(row)
    return groups


def peer_groups(lines: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Group]:
    groups: dict[tuple[str, str], Group] = {}
    for run in lines:
        if run.get("summary") or run.get("mode") not in CASES:
            continue
        if run["mode"] != "latency" and run.get("confirm") != "batch":
            continue
        name = f"{run['system']} {'durable' if run.get('durable') else 'memory'}"
        groups.setdefault((run["mode"], name), Group(run["mode"], name)).runs.append(run)
    return groups


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def _latency(group: Group) -> str:
    p50, p99, top = group.median("p50_ms"), group.median("p99_ms"), group.median("max_ms")
    if p50 is None or p99 is None:
        return ""
    return f"{p50:.2f} / {p99:.2f} / {top or 0:.1f}"


def _ratio(kapok: float | None, peer: float | None) -> str:
    if kapok is None or not peer:
        return "n/a"
    return f"{kapok / peer:.2f}×"


def format_report(kapok: dict[tuple[str, str], Group], peers: dict[tuple[str, str], Group]) -> str:
    lines = ["## Medians", "", "| case | system | runs | msgs/s (median) | all runs | p50 / p99 / max ms |"]
    lines.append("|---|---|---|---|---|---|")
    for case in CASES:
        for key in sorted(k for k in kapok if k[0] == case) + sorted(k for k in peers if k[0] == case):
            g = kapok.get(key) or peers[key]
            runs = ", ".join(_rate(r) for r in g.all_rates())
            rate = _rate(g.median("msgs_per_s"))
            lines.append(f"| {case} | {g.name} | {len(g.runs)} | {rate} | {runs} | {_latency(g)} |")
    lines += ["", "## Ratios: Kapok ÷ peer", ""]
    lines.append(
        "Throughput (e2e, publish): above 1 = Kapok faster. Latency: p50 / p99, below 1 = Kapok quicker."
    )
    for case in CASES:
        mine = sorted(k for k in kapok if k[0] == case)
        theirs = sorted(k for k in peers if k[0] == case)
        if not mine or not theirs:
            continue
        lines += ["", f"| {case} | " + " | ".join(f"vs {peers[k].name}" for k in theirs) + " |"]
        lines.append("|---|" + "---|" * len(theirs))
        for key in mine:
            k_group = kapok[key]
            cells = []
            for peer_key in theirs:
                p_group = peers[peer_key]
                if case == "latency":
                    p50 = _ratio(k_group.median("p50_ms"), p_group.median("p50_ms"))
                    p99 = _ratio(k_group.median("p99_ms"), p_group.median("p99_ms"))
                    cells.append(f"{p50} / {p99}")
                else:
                    cells.append(_ratio(k_group.median("msgs_per_s"), p_group.median("msgs_per_s")))
            lines.append(f"| {k_group.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _kapok_files(paths: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        files += sorted(path.glob("kapok-*.json")) if path.is_dir() else [path]
    return files


def _read_documents(files: Iterable[Path]) -> list[dict[str, Any]]:
    docs = []
    for file in files:
        try:
            docs.append(json.loads(file.read_text()))
        except (OSError, ValueError) as exc:
            print(f"compare: skipping {file.name}: {exc}", file=sys.stderr)
    return docs


def _read_lines(file: Path) -> list[dict[str, Any]]:
    if not file.is_file():
        return []
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kapok.bench.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("kapok", nargs="+", help="kapok bench --json documents, or folders of kapok-*.json")
    parser.add_argument(
        "--peers", required=True, help="the peer benchmark's JSON lines (bench_peers.py --out)"
    )
    args = parser.parse_args(argv)
    kapok = kapok_groups(_read_documents(_kapok_files(args.kapok)))
    peers = peer_groups(_read_lines(Path(args.peers)))
    print(format_report(kapok, peers))
    return 0 if kapok else 1


if __name__ == "__main__":
    raise SystemExit(main())
