"""``summary.json``, what the console draws, and the rows it is made of: per topic the
days' sums and the overall durations, each group's backlog at the end of its last window,
and each consumer's deliveries. Plain Python on the collected rows (a few per topic and
day) of ``kapok.analytics.transforms``' tables, whose docstring states the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC
from typing import Any, Final

from kapok.analytics.kinds import DURATION_METRICS, GROUP_SUMS, HIST_BOUNDS_MS, PERCENTILES, SUMS
from kapok.analytics.transforms import StatRow, add, pivot, window_column

__all__ = ["consumer_totals", "last_windows", "summary", "topic_totals"]


def consumer_totals(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per topic × group × consumer: the deliveries of ``consumer_table``'s rows, for the summary."""
    sums: dict[tuple[str, str, str], list[int]] = {}
    for row in rows:
        add(
            sums.setdefault((row["topic"], row["group"] or "", row["consumer"]), [0, 0]),
            (row["delivered"], row["redelivered"]),
        )
    return [
        {
            "topic": topic,
            "group": group,
            "consumer": consumer,
            "delivered": delivered,
            "redelivered": redelivered,
        }
        for (topic, group, consumer), (delivered, redelivered) in sorted(sums.items())
    ]


def topic_totals(daily: Iterable[Mapping[str, Any]], stats: Iterable[StatRow]) -> list[dict[str, Any]]:
    """Per topic: the days' sums (a column an older table lacks counts 0), and the
    overall durations (``pivot``)."""
    sums: dict[str, list[int]] = {}
    for row in daily:
        add(sums.setdefault(row["topic"], [0] * len(SUMS)), [row.get(name) for name in SUMS])
    overall: dict[str, list[StatRow]] = {}
    for stat in stats:
        if stat.window_t is None:
            overall.setdefault(stat.topic, []).append(stat)
    return [
        {"topic": topic, **dict(zip(SUMS, figures, strict=True)), **pivot(overall.get(topic, ()))}
        for topic, figures in sorted(sums.items())
    ]


def last_windows(groups: Iterable[Mapping[str, Any]], window: str) -> list[dict[str, Any]]:
    """Each group's row of its last window (the backlog the summary shows)."""
    column = window_column(window)
    last: dict[tuple[str, str], Mapping[str, Any]] = {}
    for row in groups:
        key = (row["topic"], row["group"])
        if key not in last or row[column] > last[key][column]:
            last[key] = row
    return [dict(row) for row in last.values()]


SUMMARY_COUNTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired")


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _hist(value: Any) -> list[int] | None:
    return None if value is None else [int(n) for n in value]


def _group(row: Mapping[str, Any], column: str) -> dict[str, Any]:
    start = row[column]
    out: dict[str, Any] = {
        "topic": str(row["topic"]),
        "group": str(row["group"]),
        "window_start": start.astimezone(UTC).isoformat().replace("+00:00", "Z") if start else None,
        "ready": int(row["ready"]),
        "in_flight": int(row["in_flight"]),
    }
    age = row["oldest_unacked_age_s"]
    out["oldest_unacked_age_s"] = None if age is None else round(float(age), 3)
    out.update({name: int(row[name]) for name in GROUP_SUMS})
    return out


def summary(
    topics: Iterable[Mapping[str, Any]],
    days: Iterable[Mapping[str, Any]],
    generated_at: str,
    groups: Iterable[Mapping[str, Any]] = (),
    window: str = "hour",
    consumers: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The console's ``summary.json`` from ``topic_totals``, ``daily_counts``, the last
    ``group_table`` row of each group and ``consumer_totals``.

    ``{"generated_at", "topics": {t: {counts…, "latency_ms": {"p50", "p95", "p99"}, …}},
    "days": [{"day", "topic", counts…, "dropped", "bytes", "redelivery_ratio"}], …}``,
    days sorted by day then topic; a latency is null where no ack had a known creation time.
    Added after those keys: per topic ``queue_wait_ms``, ``processing_ms`` and ``delay_ms``
    (p50, p95, p99 each), ``delayed`` and ``histograms`` (``latency``, ``queue_wait``,
    ``processing``, ``delay``: counts per bucket, null without any); at the top
    ``window``, ``histogram_bounds_ms``, ``groups`` (sorted by topic, group: the
    backlog at the end of the group's last window) and ``consumers`` (per topic, group and
    consumer: ``delivered``, ``redelivered`` in the days this run read).
    """
    out_topics: dict[str, Any] = {}
    for row in sorted(topics, key=lambda r: str(r["topic"])):
        entry: dict[str, Any] = {name: int(row[name]) for name in SUMMARY_COUNTS}
        entry["latency_ms"] = {name: _ms(row[f"latency_{name}_ms"]) for name in PERCENTILES}
        for metric in DURATION_METRICS[1:]:
            entry[f"{metric}_ms"] = {name: _ms(row.get(f"{metric}_{name}_ms")) for name in PERCENTILES}
        entry["delayed"] = int(row.get("delayed") or 0)
        entry["histograms"] = {metric: _hist(row.get(f"{metric}_hist")) for metric in DURATION_METRICS}
        out_topics[str(row["topic"])] = entry
    out_days = []
    for row in sorted(days, key=lambda r: (str(r["day"]), str(r["topic"]))):
        day: dict[str, Any] = {"day": str(row["day"]), "topic": str(row["topic"])}
        day.update({name: int(row[name]) for name in (*SUMMARY_COUNTS, "dropped", "bytes")})
        day["redelivery_ratio"] = round(float(row["redelivery_ratio"]), 6)
        out_days.append(day)
    column = window_column(window)
    out_groups = [
        _group(row, column) for row in sorted(groups, key=lambda r: (str(r["topic"]), str(r["group"])))
    ]
    return {
        "generated_at": generated_at,
        "topics": out_topics,
        "days": out_days,
        "window": window,
        "histogram_bounds_ms": list(HIST_BOUNDS_MS),
        "groups": out_groups,
        "consumers": [dict(row) for row in consumers],
    }
