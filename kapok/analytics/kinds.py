"""The names and constants the job's figures share (no Spark here: executors and tests import it).

The rules behind them are stated in ``kapok.analytics.transforms`` and
``kapok.analytics.lifecycle``; docs/analytics.md lists every column.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "COUNTED_EVENTS",
    "DURATION_METRICS",
    "GROUP_KINDS",
    "GROUP_SUMS",
    "HIST_BOUNDS_MS",
    "NEWER_EVENTS",
    "PERCENTILES",
    "SUMS",
    "WINDOWS",
]

# Event kinds counted per topic × window, each into a column of the same name.
COUNTED_EVENTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired", "dropped")
# Kinds counted the same way, whose columns tables written before them lack (null when
# such a table is read back): kept out of COUNTED_EVENTS, which compares with old tables.
NEWER_EVENTS: Final = ("requeued", "deleted")
# Summed columns of the windows table, in order (summing hours gives days exactly).
SUMS: Final = (*COUNTED_EVENTS, "bytes", "redelivered", *NEWER_EVENTS)
# Events that name a group: an entry's life.
GROUP_KINDS: Final = ("delivered", "retried", "acked", "dead_lettered", "expired", "requeued", "dropped")
# Per topic × group × window: the counts of the kinds that name a group.
GROUP_SUMS: Final = (*GROUP_KINDS, "redelivered")
# The durations measured, in milliseconds.
DURATION_METRICS: Final = ("latency", "queue_wait", "processing", "delay")
PERCENTILES: Final = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
# Histogram buckets of every duration, in ms: bucket i counts bounds[i-1] < v <= bounds[i]
# (the first from −inf, one more after the last bound, to +inf).
HIST_BOUNDS_MS: Final = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000,
    100_000, 200_000, 600_000,
)  # fmt: skip
# ``--window``: its length in seconds (UTC windows of fixed length: no leap seconds).
WINDOWS: Final = {"minute": 60, "hour": 3600, "day": 86400}
