"""Message search, shared by KapokMQ's ``/Console/GetMessageList`` and the web console.

A scan of the messages a node holds (live ones and retained consumed ones), newest
first. The node keeps no secondary index, so a search costs one pass over its
messages; only the requested page is sorted out (``heapq.nlargest``), not every match.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from kapok.core.index import MessageIndex
from kapok.core.model import Entry, Message, Status
from kapok.core.waiting import Held, Waiting

__all__ = ["MessageQuery", "SearchPage", "search_messages"]

STATUSES = tuple(s.value for s in Status)


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """What to match; an empty field matches everything."""

    topic: str = ""
    group: str = ""  # the message has an entry in this group
    status: str = ""  # a ``Status`` value, matched in ``group`` (or in any group)
    wire_status: int | None = None  # KapokMQ's status: 0 delayed, -1 pending, 1 consumed
    start: float | None = None  # create_time >= start (unix seconds)
    end: float | None = None  # create_time <= end
    code: str = ""  # a whole code, or its first characters

    def matches(self, msg: Held, now: float) -> bool:
        if self.topic and msg.topic != self.topic:
            return False
        if self.code and not msg.code.startswith(self.code):
            return False
        if (self.start is not None and msg.create_time < self.start) or (
            self.end is not None and msg.create_time > self.end
        ):
            return False
        if self.wire_status is not None and msg.wire_status(now) != self.wire_status:
            return False
        if self.group or self.status:
            entries: tuple[Entry | Waiting, ...] = msg.all_entries()
            if self.group:
                entries = tuple(e for e in entries if e.group.name == self.group)
            if not entries or (self.status and all(e.status.value != self.status for e in entries)):
                return False
        return True


@dataclass(frozen=True, slots=True)
class SearchPage:
    total: int  # matches in all
    messages: list[Message]  # this page's, newest first


def search_messages(
    messages: MessageIndex, query: MessageQuery, now: float, page: int, size: int
) -> SearchPage:
    """Page ``page`` (from 1) of ``size`` matches, newest first (codes sort by creation time).

    A whole code is looked up in the node's index, not scanned for. The scan reads a
    ``Waiting`` as it is; only the page's are made messages.
    """
    exact = messages.get(query.code) if query.code else None
    candidates: Iterable[Held] = (exact,) if exact is not None else messages.held()
    found = [m for m in candidates if query.matches(m, now)]
    first = (page - 1) * size
    top = heapq.nlargest(first + size, found, key=lambda m: m.code)
    return SearchPage(len(found), [m.resolve() if type(m) is Waiting else m for m in top[first:]])
