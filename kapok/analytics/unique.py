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

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KEY_COLUMNS", "unique"]

# The key: (run, lsn, ev) for current lines, the content for older ones (see above).
KEY_COLUMNS: Final = ("run", "lsn", "ev", "code", "topic", "group", "attempt", "t")


def unique(events: pa.Table) -> pa.Table:
    """``events`` with each event once (its columns must include ``KEY_COLUMNS``).

    Rows are told apart by a 64-bit hash of all their fields first: a row whose hash no
    other row has is kept as it is, and only rows that share a hash (copies, or the rare
    collision) are grouped by their fields, exactly. Copies are rare, and hashing is much
    cheaper than grouping every row by twelve columns.
    """
    missing = set(KEY_COLUMNS) - set(events.column_names)
    if missing:
        raise ValueError(f"the events lack the key columns {sorted(missing)}")
    if events.num_rows == 0:
        return events
    hashes = _hashes(events)
    order = np.argsort(hashes)
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    shared = np.zeros(len(order), dtype=bool)
    shared[1:] |= same
    shared[:-1] |= same
    if not shared.any():
        return events
    names = events.column_names
    alone = events.take(pa.array(np.sort(order[~shared])))
    grouped = events.take(pa.array(order[shared])).group_by(names, use_threads=False).aggregate([])
    return pa.concat_tables([alone, grouped.select(names)])


_MIX: Final = np.uint64(0x9E3779B97F4A7C15)


def _hashes(events: pa.Table) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """A 64-bit hash of each row's fields (nulls included: a null differs from every value)."""
    h = np.zeros(events.num_rows, dtype=np.uint64)
    for column in events.columns:
        array = column.combine_chunks()
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            array = pc.dictionary_encode(array).indices  # equal strings, equal indices
        values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
        bits = np.ascontiguousarray(values).view(np.uint32 if values.dtype.itemsize == 4 else np.uint64)
        valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), np.uint64)
        word = (bits.astype(np.uint64) << np.uint64(1)) | valid
        with np.errstate(over="ignore"):
            h = (h ^ word) * _MIX
            h ^= h >> np.uint64(29)
    return h
