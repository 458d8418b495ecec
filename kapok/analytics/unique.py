"""Each event once, whatever the job's inputs overlap (a pure function of an Arrow table).

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

Both rules are one grouping of the events by all their fields (``unique``): copies agree
in every field, and the key columns are among them (for a current line, the content
follows from ``(run, lsn, ev)``; for an old one, ``run`` and ``lsn`` are null). The job
shuffles the events by code first, so a line's copies meet in one task.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = ["KEY_COLUMNS", "unique"]

# The key: (run, lsn, ev) for current lines, the content for older ones (see above).
KEY_COLUMNS: Final = ("run", "lsn", "ev", "code", "topic", "group", "attempt", "t")


def unique(events: pa.Table) -> pa.Table:
    """``events`` with each event once (its columns must include ``KEY_COLUMNS``)."""
    missing = set(KEY_COLUMNS) - set(events.column_names)
    if missing:
        raise ValueError(f"the events lack the key columns {sorted(missing)}")
    if events.num_rows == 0:
        return events
    names = events.column_names
    return events.group_by(names, use_threads=False).aggregate([]).select(names)
