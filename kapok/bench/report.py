"""Result rows of ``kapok bench``: percentiles, the printed table and the JSON document.

Pure code (no I/O besides returning strings), shared by the orchestrator, the load
processes (percentiles) and the compare summary.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Row", "document", "format_table", "percentiles"]


def percentiles(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50 / p99 / max in milliseconds, nearest-rank on the sorted samples (as the peer
    benchmark computes them); empty input gives an empty dict."""
    if not samples_ns:
        return {}
    ordered = sorted(samples_ns)
    last = len(ordered) - 1
    return {
        "p50_ms": ordered[len(ordered) // 2] / 1e6,
        "p99_ms": ordered[min(last, int(len(ordered) * 0.99))] / 1e6,
        "max_ms": ordered[last] / 1e6,
    }


@dataclasses.dataclass
class Row:
    """One measured case. ``msgs_per_s`` is the workload's headline rate (see
    docs/benchmarks.md for what it counts per workload); None where it does not apply."""

    workload: str
    protocol: str
    fsync: str
    system: str = "kapok"  # or a peer's name (``--peer``)
    round: int = 1
    ok: bool = True
    variant: str = ""
    error: str = ""
    messages: int = 0
    msgs_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    wall_s: float | None = None
    node_cpu_s: float | None = None
    node_rss_bytes: int | None = None
    producer_cpu_s: float | None = None
    consumer_cpu_s: float | None = None
    load_avg_1m: float | None = None  # the machine's, as the case started
    notes: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def label(self) -> str:
        variant = f" ({self.variant})" if self.variant else ""
        return f"{self.workload}{variant} {self.protocol} fsync={self.fsync}"


def _num(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


COLUMNS = (
    "workload",
    "protocol",
    "fsync",
    "msgs/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "node CPU s",
    "node RSS MB",
    "node µs/msg",
    "load µs/msg",
    "load avg",
)


def _cells(row: Row) -> list[str]:
    name = row.workload + (f" ({row.variant})" if row.variant else "")
    rss = None if row.node_rss_bytes is None else row.node_rss_bytes / 2**20
    rate = _num(row.msgs_per_s) if row.ok else "FAILED"
    notes = row.notes if row.ok else row.error
    return [
        name,
        row.protocol,
        row.fsync,
        rate,
        _ms(row.p50_ms),
        _ms(row.p99_ms),
        _ms(row.max_ms),
        _num(row.node_cpu_s, 2),
        _num(rss, 1),
        _num(_per_message(row, row.node_cpu_s), 1),
        _num(_per_message(row, row.producer_cpu_s, row.consumer_cpu_s), 1),
        _num(row.load_avg_1m, 2),
        notes,
    ]


def _per_message(row: Row, *cpu_s: float | None) -> float | None:
    """CPU microseconds per message of the processes given (the node's; the load
    processes', producer and consumer): None without a count or any figure."""
    known = [seconds for seconds in cpu_s if seconds is not None]
    if not known or not row.messages:
        return None
    return sum(known) / row.messages * 1e6


def format_table(rows: Iterable[Row], *, markdown: bool = True) -> str:
    """A Markdown table (readable as plain text too), one line per row; the system and
    round columns appear when there is more than one of them (``--peer``, ``--rounds``)."""
    rows = list(rows)
    systems = any(row.system != "kapok" for row in rows)
    rounds = any(row.round > 1 for row in rows)
    header = [*(["system"] if systems else []), *(["round"] if rounds else []), *COLUMNS, "notes"]
    body = [
        [*([row.system] if systems else []), *([str(row.round)] if rounds else []), *_cells(row)]
        for row in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *body]
    )


def document(rows: Sequence[Row], options: dict[str, Any], version: str, date: str) -> dict[str, Any]:
    """The ``--json`` output: what ran, where, and every row."""
    return {
        "kapok_version": version,
        "date": date,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "system": f"{platform.system()} {platform.machine()}",
        },
        "options": options,
        "rows": [dataclasses.asdict(row) for row in rows],
    }
