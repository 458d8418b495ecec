"""The Analytics page's figures: the analytics job's ``summary.json`` when there is one,
else what this node can tell from the messages it holds.

``summary.json`` (written by ``kapok analytics``) covers every archived event of the nodes
it read; the node's own view covers only the messages it still holds (live ones, and
consumed ones for ``retain_consumed_s``), which is what KapokMQ's growth chart showed. The
page always says which source it shows, and why the summary was not used when it exists
but cannot be read. Both are turned into the same shape by pure functions here; reading
the file is the caller's (in a thread).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import orjson

from kapok.config import Config
from kapok.core.model import Status
from kapok.core.waiting import Held

__all__ = [
    "Candidate",
    "check_summary",
    "from_messages",
    "from_summary",
    "generated_seconds",
    "last_days",
    "newest",
    "read_summary",
    "summary_path",
]

DAYS: Final = 7
NODE_SCAN_MAX: Final = 200_000  # newest messages looked at for the node's own view
_COUNTS: Final = ("published", "delivered", "acked", "retried", "dead_lettered", "expired")
_PERCENTILES: Final = ("p50", "p95", "p99")


def summary_path(cfg: Config) -> Path:
    folder = cfg.console.analytics_dir or str(Path(cfg.storage.dir) / "analytics")
    return Path(folder) / "summary.json"


def last_days(now: float, n: int = DAYS) -> list[str]:
    """The ``n`` UTC dates ending today, oldest first, as YYYY-MM-DD."""
    today = datetime.fromtimestamp(now, UTC).date()
    return [(today - timedelta(days=i)).isoformat() for i in range(n - 1, -1, -1)]


def read_summary(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The parsed file and "", or None and why not (blocking)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"{path.name} cannot be read: {exc.strerror or exc}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, f"{path.name} is not valid JSON ({exc})"
    problem = check_summary(data)
    return (None, f"{path.name} {problem}") if problem else (data, "")


def check_summary(data: Any) -> str:
    """Why ``data`` is no analytics summary ("" when it is one: an object with a ``topics``
    object; every other key is optional, and keys this version does not know are ignored)."""
    if not isinstance(data, dict) or not isinstance(data.get("topics", {}), dict):
        return "is not an analytics summary (no 'topics' object)"
    return ""


def generated_seconds(value: Any) -> float | None:
    """A summary's ``generated_at`` as unix seconds: a number, or an ISO 8601 text (``Z`` or
    an offset; without one, UTC); None when it is neither."""
    seconds = _number(value)
    if seconds is not None or not isinstance(value, str):
        return seconds
    try:
        when = datetime.fromisoformat(value.strip()[:40])
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A summary some node holds: the node's name and where the file is on that node."""

    node: str
    path: str
    summary: dict[str, Any]


def newest(candidates: Sequence[Candidate]) -> Candidate | None:
    """The summary written last (``generated_at``); on a tie, or when none can tell, the
    first of ``candidates`` (the caller puts this node's own first)."""
    best: Candidate | None = None
    best_at = -math.inf
    for candidate in candidates:
        at = generated_seconds(candidate.summary.get("generated_at"))
        at = -math.inf if at is None else at
        if best is None or at > best_at:
            best, best_at = candidate, at
    return best


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _charts(
    days: list[str], per_day: Mapping[tuple[str, str], float], latency: list[dict[str, Any]]
) -> dict[str, Any]:
    """The two charts' data: messages per day per topic, and latency percentiles per topic."""
    topics = sorted({t for t, _ in per_day})
    growth = [{"name": t, "values": [per_day.get((t, day), 0) for day in days]} for t in topics]
    return {
        "growth": {"x": days, "xfmt": "day", "unit": "messages / day", "series": growth},
        "latency_chart": {
            "categories": [row["topic"] for row in latency],
            "unit": "ms",
            "series": [{"name": p, "values": [row[p] for row in latency]} for p in _PERCENTILES],
        },
    }


def _generated(value: Any) -> str:
    """The summary's ``generated_at``: unix seconds or a text, shown as UTC."""
    seconds = _number(value)
    if seconds is not None:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return value[:40] if isinstance(value, str) else ""


def from_summary(data: dict[str, Any], now: float) -> dict[str, Any]:
    """Chart data from a ``summary.json`` (items of the wrong shape are skipped)."""
    days = last_days(now)
    wanted = set(days)
    per_day: dict[tuple[str, str], float] = {}
    for item in data.get("days") or ():
        if not isinstance(item, dict) or item.get("day") not in wanted:
            continue
        count = _number(item.get("published"))
        if count is not None and isinstance(item.get("topic"), str):
            key = (item["topic"], item["day"])
            per_day[key] = per_day.get(key, 0) + count
    totals, latency = [], []
    for topic, figures in sorted(data["topics"].items()):
        if not isinstance(figures, dict):
            continue
        totals.append({"topic": topic, **{k: _number(figures.get(k)) for k in _COUNTS}})
        lat = figures.get("latency_ms")
        if isinstance(lat, dict):
            latency.append({"topic": topic, **{p: _number(lat.get(p)) for p in _PERCENTILES}})
    return {
        "source": "summary",
        "generated": _generated(data.get("generated_at")),
        "days": days,
        "latency": latency,
        "totals": totals,
        **_charts(days, per_day, latency),
    }


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def from_messages(messages: Iterable[Held], now: float) -> dict[str, Any]:
    """Chart data from the messages a node holds (the newest ``NODE_SCAN_MAX``): per topic,
    the messages held, their deliveries and how they ended; latency is ack time − creation
    time of the consumed ones still retained."""
    days = last_days(now)
    wanted = set(days)
    per_day: dict[tuple[str, str], float] = {}
    latencies: dict[str, list[float]] = {}
    totals: dict[str, dict[str, float]] = {}
    scanned = 0
    for msg in messages:
        if scanned >= NODE_SCAN_MAX:
            break
        scanned += 1
        day = datetime.fromtimestamp(msg.create_time, UTC).date().isoformat()
        if day in wanted:
            key = (msg.topic, day)
            per_day[key] = per_day.get(key, 0) + 1
        counts = totals.get(msg.topic) or totals.setdefault(msg.topic, dict.fromkeys(_COUNTS, 0))
        counts["published"] += 1
        for entry in msg.all_entries():
            status, attempts = entry.status, entry.attempts
            counts["delivered"] += attempts
            counts["retried"] += max(attempts - 1, 0)
            if status is Status.DEAD:
                counts["dead_lettered"] += 1
            elif status is Status.EXPIRED:
                counts["expired"] += 1
            elif status is Status.CONSUMED and attempts:  # (a requeued dead letter had none)
                counts["acked"] += 1
                latencies.setdefault(msg.topic, []).append((entry.settled_at - msg.create_time) * 1000)
    latency = [
        {"topic": topic, **{p: round(_percentile(sorted(values), float(p[1:])), 3) for p in _PERCENTILES}}
        for topic, values in sorted(latencies.items())
    ]
    return {
        "source": "node",
        "generated": "",
        "days": days,
        "latency": latency,
        "totals": [{"topic": t, **counts} for t, counts in sorted(totals.items())],
        "scanned": scanned,
        "truncated": scanned >= NODE_SCAN_MAX,
        **_charts(days, per_day, latency),
    }
