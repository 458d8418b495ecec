"""The input ledger of incremental runs: which archive files a run has read, and their times.

``<output>/_kapok_inputs.json`` lists, per archive file read, its size and mtime and the
first and last event time ``t`` in it. It is written after the tables and
``summary.json`` (so a run that fails leaves the old ledger, and the next run reads its
files again). The rules, as pure functions:

* A file is *new* when the ledger does not list it, or lists another size or mtime
  (the archive appends to its last file: that one grows). Only new files are scanned
  for their times (``plan``).
* The days to recompute are the UTC days from a new file's first to its last event,
  and a grown file's earlier days too (``touched_days``).
* A file that is gone (retention) changes nothing already written: the days it held
  keep their partitions, and it leaves the ledger.
* No ledger, one that does not read, another ``--window`` or another set of inputs:
  a full run, and the reason says why (``plan``).

A message's life crosses days and files (its publish, deliveries and ack; a group's
backlog is a running sum over all of them), so a run also carries what a later run needs
to start at the midnight that begins the input's last day (``Carried``: every event from
then on, the events before it of the messages open then, and each group's first event).
The next run starts there when no touched day is earlier (``resumed_days``): it reads only
the new files and the carried events, and recomputes every day from that midnight to the
input's last, each equal to a full run's. Otherwise it reads every file, and still writes
only the touched days.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

__all__ = [
    "CARRY_DIR",
    "LEDGER_FILE",
    "Carried",
    "FileSpan",
    "FileStamp",
    "Ledger",
    "LedgerError",
    "Plan",
    "decode",
    "encode",
    "merge",
    "plan",
    "resumed_days",
    "touched_days",
]

LEDGER_FILE: Final = "_kapok_inputs.json"
CARRY_DIR: Final = "_kapok_carried"
VERSION: Final = 1
_DAY_S: Final = 86400


class LedgerError(ValueError):
    """A ledger that does not read (torn, foreign, or of another version)."""


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What tells a file changed: its size and modification time."""

    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class FileSpan:
    """A file read by a run: its stamp then, and its first and last event time (None: no events)."""

    stamp: FileStamp
    first_t: float | None
    last_t: float | None


@dataclass(frozen=True, slots=True)
class Carried:
    """What the run left for the next one to start at ``t`` (a UTC midnight) with the files
    new since: in ``<output>/CARRY_DIR/<name>``, every event from ``t`` on (``recent`` of
    them) and the events before ``t`` of the messages open then; and per topic, per group,
    the time of the group's first event."""

    t: float
    name: str
    starts: Mapping[str, Mapping[str, float]]
    recent: int


@dataclass(frozen=True, slots=True)
class Ledger:
    settings: Mapping[str, Any]  # what a run's figures depend on besides the files: window, inputs
    files: Mapping[str, FileSpan] = field(default_factory=dict)
    carried: Carried | None = None  # None: written before runs carried anything, or none did


@dataclass(frozen=True, slots=True)
class Plan:
    full: bool
    reason: str  # why the run is full ("" for an incremental one)
    new: tuple[str, ...]  # files to scan for their times: every file of a full run


def plan(
    ledger: Ledger | None,
    current: Mapping[str, FileStamp],
    settings: Mapping[str, Any],
    *,
    full: bool = False,
    unreadable: str = "",
) -> Plan:
    """Whether the run is full, and which files are new.

    ``ledger`` None: no ledger (``unreadable`` says why it did not read, if it was there).
    """
    every = tuple(sorted(current))
    if full:
        return Plan(True, "--full", every)
    if ledger is None:
        return Plan(
            True, f"the input ledger does not read ({unreadable})" if unreadable else "first run", every
        )
    changed = [
        key
        for key in sorted(set(settings) | set(ledger.settings))
        if settings.get(key) != ledger.settings.get(key)
    ]
    if changed:
        return Plan(
            True, f"{' and '.join(_setting_name(key) for key in changed)} changed since the last run", every
        )
    new = tuple(path for path in every if ledger.files.get(path, _NO_SPAN).stamp != current[path])
    return Plan(False, "", new)


_NO_SPAN: Final = FileSpan(FileStamp(-1, -1.0), None, None)


def _setting_name(key: str) -> str:
    return {"window": "--window", "inputs": "the set of --input"}.get(key, key)


def _days(first_t: float | None, last_t: float | None) -> set[str]:
    if first_t is None or last_t is None:
        return set()
    first, last = math.floor(first_t / _DAY_S), math.floor(last_t / _DAY_S)
    return {_day_name(day) for day in range(first, last + 1)}


def _day_name(day: int) -> str:
    return datetime.fromtimestamp(day * _DAY_S, UTC).strftime("%Y-%m-%d")


def touched_days(ledger: Ledger | None, scanned: Mapping[str, FileSpan]) -> set[str]:
    """The UTC days (``YYYY-MM-DD``) the scanned files' events fall on, and those of a grown
    file's earlier reading."""
    days: set[str] = set()
    for path, span in scanned.items():
        days |= _days(span.first_t, span.last_t)
        before = None if ledger is None else ledger.files.get(path)
        if before is not None:
            days |= _days(before.first_t, before.last_t)
    return days


def resumed_days(
    carried: Carried | None, days: Iterable[str], last_t: float | None = None
) -> list[str] | None:
    """The days a run that starts at ``carried.t`` recomputes to cover ``days``: every day
    from ``carried.t``'s to the last of ``days`` or ``last_t``'s (the input's last event:
    a change on one day moves the backlog of every later one); None when one of ``days``
    is earlier (or nothing was carried, or nothing is touched): then every file is read."""
    wanted = sorted(days)
    if carried is None or not wanted:
        return None
    first = math.floor(carried.t / _DAY_S)
    if wanted[0] < _day_name(first):
        return None
    last = math.floor(datetime.strptime(wanted[-1], "%Y-%m-%d").replace(tzinfo=UTC).timestamp() / _DAY_S)
    if last_t is not None:
        last = max(last, math.floor(last_t / _DAY_S))
    return [_day_name(day) for day in range(first, max(first, last) + 1)]


def merge(
    ledger: Ledger | None,
    current: Mapping[str, FileStamp],
    scanned: Mapping[str, FileSpan],
    settings: Mapping[str, Any],
    carried: Carried | None = None,
) -> Ledger:
    """The ledger after a run: every current file, scanned now or known from before (gone
    ones leave), and what the run carried."""
    known = {} if ledger is None else ledger.files
    files = {
        path: scanned[path] if path in scanned else known[path]
        for path in sorted(current)
        if path in scanned or path in known
    }
    return Ledger(dict(settings), files, carried)


def encode(ledger: Ledger) -> str:
    body = {
        "version": VERSION,
        "settings": dict(ledger.settings),
        "files": {
            path: {"size": s.stamp.size, "mtime": s.stamp.mtime, "first_t": s.first_t, "last_t": s.last_t}
            for path, s in ledger.files.items()
        },
    }
    if ledger.carried is not None:
        carried = ledger.carried
        body["carried"] = {
            "t": carried.t,
            "name": carried.name,
            "starts": carried.starts,
            "recent": carried.recent,
        }
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def decode(text: str) -> Ledger:
    """The ledger in ``text``; ``LedgerError`` if it is not one this version wrote."""
    try:
        body = json.loads(text)
        if not isinstance(body, dict) or body.get("version") != VERSION:
            raise LedgerError("not a ledger of this version")
        settings = body["settings"]
        if not isinstance(settings, dict):
            raise LedgerError("no settings")
        files = {str(path): _span(entry) for path, entry in body["files"].items()}
        carried = _carried(body.get("carried"))
    except LedgerError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"not a ledger: {type(exc).__name__}") from None
    return Ledger(settings, files, carried)


def _carried(entry: Any) -> Carried | None:
    """The ``carried`` entry; None when there is none, or it does not read (the next run
    then reads every file, as before runs carried anything)."""
    if not isinstance(entry, dict):
        return None
    t, name, starts, recent = entry.get("t"), entry.get("name"), entry.get("starts"), entry.get("recent")
    if not isinstance(t, int | float) or not isinstance(name, str) or not name or "/" in name:
        return None
    if not isinstance(recent, int) or isinstance(recent, bool) or recent < 0:
        return None  # from before runs carried every recent event: that table is not enough
    if not isinstance(starts, dict) or not all(
        isinstance(groups, dict) and all(isinstance(v, int | float) for v in groups.values())
        for groups in starts.values()
    ):
        return None
    return Carried(
        float(t),
        name,
        {str(k): {str(g): float(v) for g, v in gs.items()} for k, gs in starts.items()},
        recent,
    )


def _span(entry: Any) -> FileSpan:
    size, mtime, first, last = entry["size"], entry["mtime"], entry["first_t"], entry["last_t"]
    if not isinstance(size, int) or not isinstance(mtime, int | float):
        raise LedgerError("a file without size or mtime")
    if (first is None) != (last is None) or not all(
        v is None or isinstance(v, int | float) for v in (first, last)
    ):
        raise LedgerError("a file with broken times")
    return FileSpan(
        FileStamp(size, float(mtime)),
        None if first is None else float(first),
        None if last is None else float(last),
    )
