"""Each event once, whatever the job's inputs overlap (a pure DataFrame function).

The job reads every node's archive, masters and slaves: after a takeover the slave's
archive holds the only copy of its active period. A node archives only the records it
writes while it leads (its archive starts when it starts leading, with the records
written from then on), so two nodes' archives share no event; but the same archive may
reach the job twice (a directory and a glob inside it, a copy on shared storage and the
node's own), and then each of its events must still count once.

The rule (docs/analytics.md, "Event schema"):

* An event written by a current archiver carries ``run`` (a random id of the archiver
  process that wrote it) and ``lsn`` (the WAL position of the record that made it). A
  record makes at most one event of each kind, so ``(run, lsn, ev)`` names the event: two
  lines with the same three are copies of one line. ``run`` rather than the node's name:
  a node whose log diverged (its last records never reached the slave that took over)
  leads again from an LSN it had already archived, for other records, and then writes
  under a new run.
* A line written before these fields existed is named by its content: ``ev``, ``code``,
  ``topic``, ``group``, ``attempt`` and ``t`` (a float of the event's own clock reading).
  Copies agree on all of them; two real events of one kind, one message and one group at
  the same instant with the same attempt do not occur.

Both rules are one ``dropDuplicates`` over the union of the two keys (for a current
line, the content follows from ``(run, lsn, ev)``; for an old one, ``run`` and ``lsn``
are null): one shuffle of the events.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import DataFrame

__all__ = ["KEY_COLUMNS", "read_schema", "unique_events"]

# The key: (run, lsn, ev) for current lines, the content for older ones (see above).
KEY_COLUMNS: Final = ("run", "lsn", "ev", "code", "topic", "group", "attempt", "t")
# Key columns the job's schema may not read for its figures, with their types.
_KEY_TYPES: Final = {
    "run": "STRING",
    "lsn": "LONG",
    "ev": "STRING",
    "code": "STRING",
    "topic": "STRING",
    "group": "STRING",
    "attempt": "INT",
    "t": "DOUBLE",
}


def read_schema(schema: str) -> str:
    """``schema`` (a DDL string, ``"name TYPE, ..."``) with the key columns it lacks added."""
    names = {part.strip().split()[0].strip("`").lower() for part in schema.split(",") if part.strip()}
    extra = [f"`{name}` {kind}" for name, kind in _KEY_TYPES.items() if name not in names]
    return ", ".join([schema, *extra]) if extra else schema


def unique_events(events: DataFrame) -> DataFrame:
    """``events`` with each event once (``KEY_COLUMNS``: see the module's docstring)."""
    return events.dropDuplicates(list(KEY_COLUMNS))
