"""Records a returning master wrote that its pair never shared: set aside for the operator.

When a master comes back after its slave took over, whatever its log holds past the
point both logs share never reached the new master: in sync mode those writes were never
confirmed to a producer, in async mode they are the replication loss. They are written to
``<storage.dir>/diverged/`` as JSON lines, one record a line, messages with their
payloads, so an operator can look at them and publish again what matters.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from kapok.core import changes as ch

__all__ = ["record_json", "write_diverged"]

_TYPES = {
    ch.Published: "published",
    ch.GroupCreated: "group_created",
    ch.Delivered: "delivered",
    ch.Requeued: "requeued",
    ch.Settled: "settled",
    ch.MessageDeleted: "deleted",
    ch.Deduped: "deduped",
    ch.Checkpoint: "checkpoint",
}


def record_json(record: ch.Change) -> dict[str, Any]:
    row: dict[str, Any] = {"type": _TYPES[type(record)]}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.name == "data":
            try:
                row["data"] = value.decode()
            except UnicodeDecodeError:
                row["data"] = base64.b64encode(value).decode()
                row["encoding"] = "base64"
        else:
            row[field.name] = list(value) if isinstance(value, tuple) else value
    return row


def write_diverged(records: Iterable[ch.Change], path: Path) -> tuple[int, int]:
    """Write ``records`` to ``path``; returns how many, and how many were publishes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = published = 0
    with path.open("wb") as out:
        for record in records:
            row = record_json(record)
            published += row["type"] == "published"
            out.write(orjson.dumps(row) + b"\n")
            count += 1
    return count, published
