"""Medians over rounds and ratios Kapok ÷ peer, for ``kapok bench --rounds R --peer ...``.

Rows of one configuration (system, workload, protocol, fsync, variant) are a group; a
group's figure is the median of its rounds. Each Kapok group is set against each peer
group of the same workload: throughput Kapok ÷ peer (above 1: Kapok is faster), latency p50
and p99 Kapok ÷ peer (below 1: Kapok is quicker), node RSS Kapok ÷ peer (below 1: Kapok
holds less). Pure code (rows in, dicts and Markdown out), but for ``main``:

    python -m kapok.bench.summary RUN.json...

which merges the rows of several ``kapok bench --json`` documents (e.g. one per round, with
the peer restarted between rounds) and prints the same medians and ratios.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kapok.bench.report import Row

__all__ = ["format_summary", "main", "rows_of", "summarize"]

_FIGURES = ("msgs_per_s", "p50_ms", "p99_ms", "max_ms", "node_rss_bytes", "node_cpu_s")


def _name(row: Row) -> str:
    variant = f" ({row.variant})" if row.variant else ""
    if row.system != "kapok":
        return row.system + variant
    return f"kapok {row.protocol} fsync={row.fsync}{variant}"


def _median(rows: list[Row], figure: str) -> float | None:
    values = [float(v) for v in (getattr(r, figure) for r in rows) if v is not None]
    return statistics.median(values) if values else None


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return None if mine is None or not theirs else mine / theirs


def summarize(rows: Iterable[Row]) -> dict[str, Any]:
    """``{"groups": [...], "ratios": [...]}``: medians per group, ratios per Kapok × peer pair."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.ok:
            groups.setdefault((row.workload, _name(row)), []).append(row)
    out_groups: list[dict[str, Any]] = []
    for (workload, name), members in groups.items():
        medians = {figure: _median(members, figure) for figure in _FIGURES}
        system = members[0].system
        rates = [r.msgs_per_s for r in members if r.msgs_per_s is not None]
        out_groups.append(
            {
                "workload": workload,
                "name": name,
                "system": system,
                "runs": len(members),
                "rates": rates,
                **medians,
            }
        )
    ratios = []
    for mine in out_groups:
        if mine["system"] != "kapok":
            continue
        for theirs in out_groups:
            if theirs["system"] == "kapok" or theirs["workload"] != mine["workload"]:
                continue
            ratios.append(
                {
                    "workload": mine["workload"],
                    "kapok": mine["name"],
                    "peer": theirs["name"],
                    **{
                        f: _ratio(mine[f], theirs[f])
                        for f in ("msgs_per_s", "p50_ms", "p99_ms", "node_rss_bytes")
                    },
                }
            )
    return {"groups": out_groups, "ratios": ratios}


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{unit}"


def format_summary(summary: dict[str, Any]) -> str:
    """Markdown: the medians, then the ratios (empty string when there is nothing to add)."""
    groups, ratios = summary["groups"], summary["ratios"]
    if not groups or (not ratios and all(g["runs"] == 1 for g in groups)):
        return ""
    lines = ["Medians over rounds:", ""]
    lines += [
        "| workload | system | runs | msgs/s | all runs | p50 ms | p99 ms | node RSS MB |",
        "|" + "---|" * 8,
    ]
    for g in groups:
        rss = None if g["node_rss_bytes"] is None else g["node_rss_bytes"] / 2**20
        runs = ", ".join(f"{r:,.0f}" for r in g["rates"])
        lines.append(
            f"| {g['workload']} | {g['name']} | {g['runs']} | {_fmt(g['msgs_per_s'], ',.0f')} | {runs} | "
            f"{_fmt(g['p50_ms'], '.2f')} | {_fmt(g['p99_ms'], '.2f')} | {_fmt(rss, ',.1f')} |"
        )
    if ratios:
        lines += [
            "",
            "Kapok ÷ peer (medians): msgs/s above 1 = Kapok faster; p50, p99, RSS below 1 = Kapok better.",
            "",
        ]
        lines += ["| workload | kapok | peer | msgs/s | p50 | p99 | node RSS |", "|" + "---|" * 7]
        for r in ratios:
            cells = [_fmt(r[f], ".2f", "×") for f in ("msgs_per_s", "p50_ms", "p99_ms", "node_rss_bytes")]
            lines.append(f"| {r['workload']} | {r['kapok']} | {r['peer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_of(document: dict[str, Any]) -> list[Row]:
    """The rows of a ``kapok bench --json`` document (fields it does not know are ignored)."""
    known = {f.name for f in dataclasses.fields(Row)}
    return [Row(**{k: v for k, v in row.items() if k in known}) for row in document.get("rows", [])]


def main(argv: Sequence[str] | None = None) -> int:
    files = list(sys.argv[1:] if argv is None else argv)
    if not files:
        print("usage: python -m kapok.bench.summary RUN.json...", file=sys.stderr)
        return 2
    rows: list[Row] = []
    for name in files:
        try:
            rows += rows_of(json.loads(Path(name).read_text()))
        except (OSError, ValueError, TypeError) as exc:
            print(f"summary: cannot read {name}: {exc}", file=sys.stderr)
            return 1
    print(format_summary(summarize(rows)) or "nothing to summarize (one run of each case, no peer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
