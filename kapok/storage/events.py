"""The archive's lifecycle events, pure: change records (their rows, as the WAL holds
them: ``kapok.storage.records``) turned into flat events, one JSON object each:
``{"ev", "code", "topic", "group", "t", ...}``, and those events as JSON lines.

Each kind means one thing (docs/analytics.md, "Event schema"): a requeue from a DLQ is
``requeued``, not ``acked``; a delete is one ``deleted`` event, not a ``dropped`` per
open entry; an expiry moved to the DLQ is both ``expired`` and ``dead_lettered``.
``kapok.storage.archive`` writes them to its files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from kapok.core import changes as ch
from kapok.core.model import Status
from kapok.jsonlines import dumps_lines
from kapok.storage.records import KINDS

__all__ = ["Event", "archive_events", "encode_events"]

Event = dict[str, Any]

_SETTLED_EVENTS: Final = {
    Status.CONSUMED.value: "acked",
    Status.DEAD.value: "dead_lettered",
    Status.EXPIRED.value: "expired",
    Status.DROPPED.value: "dropped",
}

_PUBLISHED, _DELIVERED, _REQUEUED, _SETTLED, _DELETED = (
    KINDS[t] for t in (ch.Published, ch.Delivered, ch.Requeued, ch.Settled, ch.MessageDeleted)
)


def archive_events(
    rows: Sequence[list[Any]], run: str | None = None, first_lsn: int | None = None
) -> list[Event]:
    """Lifecycle events of the records in ``rows`` (``records.batch_rows``), in order.

    With ``run`` and ``first_lsn`` (the WAL LSN of ``rows[0]``; the rows are consecutive
    records), every event also carries ``run`` and ``lsn``, its record's LSN: ``(run,
    lsn, ev)`` names the event (docs/analytics.md, "Event schema").

    Bookkeeping records yield nothing. ``t`` is the event's unix time in seconds
    (a message's creation time for ``published``). A final status the archive
    does not know yet is written under its own name rather than dropped, so new
    statuses stay visible. Every event's first key is ``ev`` (``encode_events``
    relies on it). Rows, not records: the archive needs no message data, and
    building records would cost more than the events themselves. Rows of records
    written before a field was added are shorter: the field is left out.
    """
    # This runs for every record the node writes (three per consumed message), so it
    # dispatches on the kind, most frequent first, and builds dict literals whole: the
    # run and LSN are in them (a key added later may resize the dict), and dropped again
    # for an untagged call (tests, tools), which is rare.
    events: list[Event] = []
    add = events.append
    tagged = run is not None and first_lsn is not None
    lsn = first_lsn or 0
    for row in rows:
        kind = row[0]
        if kind == _DELIVERED:
            if len(row) == 9 and row[8]:  # one naming its consumer: the usual row now
                _, code, topic, group, attempts, at, _, _, consumer = row
                add({"ev": "delivered", "code": code, "topic": topic, "group": group, "t": at,
                     "attempt": attempts, "consumer": consumer, "run": run, "lsn": lsn})  # fmt: skip
            else:  # 6 fields, a claimed one 8 (no consumer, or written before consumers were)
                _, code, topic, group, attempts, at = row if len(row) == 6 else row[:6]
                add({"ev": "delivered", "code": code, "topic": topic, "group": group, "t": at,
                     "attempt": attempts, "run": run, "lsn": lsn})  # fmt: skip
        elif kind == _SETTLED:
            _, code, topic, group, status, reason, at = row
            if status == _DEAD:
                if reason == _EXPIRED:  # the TTL passed, and mq.expired sent it to the DLQ
                    add({"ev": "expired", "code": code, "topic": topic, "group": group, "t": at, "run": run,
                         "lsn": lsn})  # fmt: skip
                add({"ev": "dead_lettered", "code": code, "topic": topic, "group": group, "t": at,
                     "reason": reason, "run": run, "lsn": lsn})  # fmt: skip
            elif reason == _REQUEUED_FROM_DLQ and status == _CONSUMED:  # published again: no ack
                add({"ev": "requeued", "code": code, "topic": topic, "group": group, "t": at, "run": run,
                     "lsn": lsn})  # fmt: skip
            elif reason == _DELETE and status == _DROPPED:
                pass  # a deleted message's open entries: its one ``deleted`` event follows
            else:
                add({"ev": _SETTLED_EVENTS.get(status, status), "code": code, "topic": topic, "group": group,
                     "t": at, "run": run, "lsn": lsn})  # fmt: skip
        elif kind == _PUBLISHED:
            _, _, code, topic, key, priority, created, deliver_at, _, producer, _, _, _, size = row
            add({"ev": "published", "code": code, "topic": topic, "t": created, "create_time": created,
                 "deliver_at": deliver_at, "size": size, "producer": producer, "priority": priority,
                 "key": key, "run": run, "lsn": lsn})  # fmt: skip
        elif kind == _REQUEUED:
            if len(row) > 6 and row[6]:
                add({"ev": "retried", "code": row[1], "topic": row[2], "group": row[3], "t": row[5],
                     "reason": row[4], "attempt": row[6], "run": run, "lsn": lsn})  # fmt: skip
            else:
                add({"ev": "retried", "code": row[1], "topic": row[2], "group": row[3], "t": row[5],
                     "reason": row[4], "run": run, "lsn": lsn})  # fmt: skip
        elif kind == _DELETED:
            topic = row[3] if len(row) > 3 else ""
            if topic:
                add({"ev": "deleted", "code": row[1], "topic": topic, "t": row[2], "run": run, "lsn": lsn})
            else:
                add({"ev": "deleted", "code": row[1], "t": row[2], "run": run, "lsn": lsn})
        # GroupCreated, Deduped, Checkpoint: bookkeeping, not part of a message's life.
        lsn += 1
    if not tagged:
        for event in events:
            del event["run"], event["lsn"]
    return events


_DEAD: Final = Status.DEAD.value
_CONSUMED: Final = Status.CONSUMED.value
_DROPPED: Final = Status.DROPPED.value
_EXPIRED: Final = ch.EXPIRED
_REQUEUED_FROM_DLQ: Final = ch.REQUEUED
_DELETE: Final = ch.DELETED


def encode_events(
    rows: Sequence[list[Any]], run: str | None = None, first_lsn: int | None = None
) -> tuple[bytes, int]:
    """The JSON lines of the events of ``rows`` (each ending in ``\\n``) and how many."""
    events = archive_events(rows, run, first_lsn)
    if not events:
        return b"", 0
    return dumps_lines(events, "ev") + b"\n", len(events)
