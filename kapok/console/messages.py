"""The console's message search and message view: query parsing, rows, one message's story.

Search goes through ``kapok.server.routes.search`` (shared with KapokMQ's GetMessageList). Times
in the form are UTC, as every time the console shows. A message's history is its entries'
state (held in memory) plus, when the node writes the archive, the lifecycle events the
archive holds for its code: found by a bounded scan of the files written since it was
created (run in a thread; at most ``HISTORY_SCAN_BYTES`` read).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from kapok.core.model import Message
from kapok.errors import BadRequestError
from kapok.server.routes.responses import int_field
from kapok.server.routes.search import STATUSES, MessageQuery, search_messages
from kapok.service import BrokerService
from kapok.storage.archive import list_archive_files

__all__ = ["SearchForm", "history_events", "message_detail", "parse_search", "search_page"]

MAX_PAGE_SIZE: Final = 200
HISTORY_SCAN_BYTES: Final = 64 * 1024 * 1024
HISTORY_MAX_EVENTS: Final = 200
_TIME_FORMATS: Final = (
    "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d",
)  # fmt: skip

SearchForm = dict[str, str]


def _parse_time(text: str, name: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    for fmt in _TIME_FORMATS:
        with contextlib.suppress(ValueError):
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
    raise BadRequestError(f"{name} must be a UTC date and time such as 2026-01-31T23:59, got {text[:40]!r}")


def parse_search(params: Mapping[str, str]) -> tuple[SearchForm, MessageQuery, int, int]:
    """The form as typed (to fill it in again), the query, the page and the page size."""
    form = {k: params.get(k, "").strip()[:255] for k in ("start", "end", "topic", "group", "status", "code")}
    status = form["status"]
    if status and status not in STATUSES:
        raise BadRequestError(f"status must be one of {', '.join(STATUSES)}, or empty for all")
    code = form["code"].lower()
    if code and any(c not in "0123456789abcdef" for c in code):
        raise BadRequestError("code must be hexadecimal digits (a whole code or its first digits)")
    query = MessageQuery(
        topic=form["topic"],
        group=form["group"],
        status=status,
        start=_parse_time(form["start"], "start"),
        end=_parse_time(form["end"], "end"),
        code=code,
    )
    page = int_field(params, "page", 1, 1, 1_000_000)
    size = int_field(params, "size", 50, 1, MAX_PAGE_SIZE)
    return form, query, page, size


def _statuses(msg: Message) -> dict[str, str]:
    return {e.group.name: e.status.value for e in msg.all_entries()}


def _requeueable(msg: Message) -> bool:
    """A live dead letter that knows its topic (what ``requeue_dead_letter`` accepts)."""
    return msg.live and msg.topic.endswith(".dlq") and bool((msg.headers or {}).get("original_topic"))


def message_row(msg: Message) -> dict[str, Any]:
    return {
        "code": msg.code,
        "topic": msg.topic,
        "key": msg.key,
        "priority": msg.priority,
        "create_time": msg.create_time,
        "deliver_at": msg.deliver_at if msg.deliver_at > msg.create_time else None,
        "size": msg.size,
        "statuses": _statuses(msg),
        "attempts": max((e.attempts for e in msg.all_entries()), default=0),
        "finished": not msg.live,
        "requeue": _requeueable(msg),
    }


def search_page(service: BrokerService, query: MessageQuery, page: int, size: int) -> dict[str, Any]:
    found = search_messages(service.broker.messages, query, service.now(), page, size)
    pages = max(1, -(-found.total // size))
    return {
        "total": found.total,
        "page": page,
        "pages": pages,
        "size": size,
        "messages": [message_row(m) for m in found.messages],
    }


def _payload(data: bytes) -> dict[str, Any]:
    """The payload as text (pretty-printed when it is JSON), or base64 when not UTF-8."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return {"encoding": "base64", "text": base64.b64encode(data).decode(), "json": False}
    try:
        pretty = orjson.dumps(orjson.loads(text), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        return {"encoding": "utf8", "text": text, "json": False}
    return {"encoding": "utf8", "text": pretty, "json": True}


def message_detail(service: BrokerService, msg: Message) -> dict[str, Any]:
    consumers = service.broker.consumers
    entries = []
    for e in msg.all_entries():
        holder = consumers.get(e.consumer.id) if e.consumer is not None else None
        entries.append({
            "group": e.group.name,
            "status": e.status.value,
            "attempts": e.attempts,
            "last_delivered_at": e.last_delivered_at or None,
            "settled_at": e.settled_at or None,
            "ack_deadline": e.deadline if holder is not None else None,
            "held_by": holder.name if holder is not None else None,
        })  # fmt: skip
    headers = dict(msg.headers or {})
    return {
        **message_row(msg),
        "producer": msg.producer_id,
        "dedup_id": msg.dedup_id,
        "expire_at": msg.expire_at or None,
        "finished_at": msg.finished_at or None,
        "headers": headers,
        "payload": _payload(msg.data),
        "entries": entries,
    }


def history_events(archive_dir: Path, code: str, created: float) -> dict[str, Any]:
    """The archive's events for ``code`` (blocking: run in a thread), oldest first."""
    try:
        files = list_archive_files(archive_dir)
    except OSError:
        return {"events": [], "complete": False, "note": "the archive folder cannot be read"}
    # The file that holds the 'published' event is the last one started at or before it.
    first = 0
    for i, f in enumerate(files):
        if f.started <= created:
            first = i
    needle = code.encode()
    events: list[dict[str, Any]] = []
    budget = HISTORY_SCAN_BYTES
    complete = True
    for f in files[first:]:
        if budget <= 0 or len(events) >= HISTORY_MAX_EVENTS:
            complete = False
            break
        try:
            data = f.path.read_bytes()[:budget]
        except OSError:
            continue  # deleted by retention meanwhile
        budget -= len(data)
        at = data.find(needle)
        while at >= 0 and len(events) < HISTORY_MAX_EVENTS:
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            if end < 0:
                break  # an unfinished last line
            with contextlib.suppress(orjson.JSONDecodeError):
                event = orjson.loads(data[start:end])
                if isinstance(event, dict) and event.get("code") == code:
                    events.append(event)
            at = data.find(needle, end)
    events.sort(key=lambda e: e.get("t", 0.0) if isinstance(e.get("t"), int | float) else 0.0)
    return {"events": events, "complete": complete, "note": ""}
