"""The broker's messages by code, at about 9 bytes a message.

Theory of operation. A code made by ``make_code`` carries its message's
sequence number, and a node numbers its messages one after another, so the
index is a list addressed by sequence number: ``rows[seq - base]``. Finding
a code reads the number back from it and checks that the message found there
has that very code. A dict entry by code cost ~41 bytes a message and the
code string itself 96 more; a list slot costs 8 and a ``Message`` that waits
keeps no code (``CodeBlock``). A message that waits far back may be held as a
``Waiting`` (``kapok.core.waiting``): a lookup makes it a ``Message`` and
keeps that in its place; ``held`` and ``newest_first`` read it as it is.

Finished messages leave holes (``None``); the holes at the front are cut
off once they are half the list. The few messages the list cannot hold are
*strays*, in a dict by code: a foreign code (KapokMQ imports, which do not
carry their number), a number already taken or far below or beyond the list,
and the last old messages when holes behind them would pile up (one message
left unacked while millions pass). Iteration is in sequence order, strays
merged in.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterator

from kapok.core.codes import SEQ_MASK, code_seq
from kapok.core.model import Message
from kapok.core.waiting import Held, Waiting

__all__ = ["MessageIndex"]

_SEQ = operator.attrgetter("seq")
# Holes allowed at the front before they are cut off, and numbers a new message may skip
# ahead of the list's end before it is a stray (the list would grow by as many holes).
_SLACK = 65_536


class MessageIndex:
    """Messages by code (live and retained), in sequence order."""

    __slots__ = ("_base", "_count", "_rows", "_start", "_strays")

    def __init__(self) -> None:
        self._rows: list[Held | None] = []
        self._base = 0  # the sequence number of rows[0]
        self._start = 0  # rows[:_start] are holes
        self._count = 0  # messages in rows
        self._strays: dict[str, Held] = {}

    def __len__(self) -> int:
        return self._count + len(self._strays)

    def __contains__(self, code: object) -> bool:
        return isinstance(code, str) and self.get(code) is not None

    def __getitem__(self, code: str) -> Message:
        msg = self.get(code)
        if msg is None:
            raise KeyError(code)
        return msg

    def __iter__(self) -> Iterator[str]:
        """The codes, in sequence order."""
        return (msg.code for msg in self._walk())

    def get(self, code: str) -> Message | None:
        seq = code_seq(code)
        return self.find(code, seq if seq is not None else -1)

    def find(self, code: str, seq: int) -> Message | None:
        """``get(code)`` for a code known to be message ``seq``'s if it is ``make_code``'s
        (replay's question of every record it is given), without reading the number back.
        A ``Waiting`` found is made a ``Message``, which takes its place."""
        i = seq - self._base
        rows = self._rows
        if 0 <= i < len(rows):
            msg = rows[i]
            if msg is not None and msg.code == code:
                if type(msg) is Waiting:
                    msg = rows[i] = msg.resolve()
                return msg
        strays = self._strays
        if not strays:
            return None
        held = strays.get(code)
        if type(held) is Waiting:
            held = strays[code] = held.resolve()
        return held

    def add_numbered(self, msg: Held) -> None:
        """Index ``msg``, whose code is of ``make_code``'s layout, whole or not (``CodeBlock``):
        every message published here, and every replayed one with such a code."""
        rows = self._rows
        if msg.seq - self._base == len(rows) and self._count:
            rows.append(msg)  # the next number: every publish
            self._count += 1
        elif msg.seq > SEQ_MASK or not self._place(msg):
            self._strays[msg.code] = msg

    def add(self, msg: Held) -> None:
        """Index ``msg`` (its code not indexed yet): by its number if its code is made from a
        ``CodeBlock``, else as a stray."""
        if msg.compact_code:
            self.add_numbered(msg)
        else:
            self._strays[msg.code] = msg

    def _place(self, msg: Held) -> bool:
        """Put ``msg``, whose code carries its number, in the list if it fits there."""
        rows = self._rows
        if not self._count:
            rows.clear()
            self._base = msg.seq
            self._start = 0
        i = msg.seq - self._base
        n = len(rows)
        if n <= i <= n + _SLACK:
            rows.extend([None] * (i - n))
            rows.append(msg)
        elif self._start <= i < n and rows[i] is None:
            rows[i] = msg
        elif i > n and self._count <= _SLACK:
            # Far ahead (numbers skipped): the few in the list become strays, and the list
            # starts again here, so that the messages after this one are rows.
            self._stray(self._start, n)
            self._base = msg.seq
            self._start = 0
            rows.append(msg)
        else:
            return False
        self._count += 1
        return True

    def discard(self, msg: Message) -> bool:
        """Forget ``msg`` if it is indexed (itself, or the ``Waiting`` it was made from);
        whether it was."""
        rows = self._rows
        i = msg.seq - self._base
        if 0 <= i < len(rows) and ((held := rows[i]) is msg or _holds(held, msg)):
            rows[i] = None
            count = self._count = self._count - 1
            if i == self._start:
                if count and rows[i + 1] is not None:  # the next one is the oldest now
                    self._start = i + 1
                    if i >= _SLACK and 2 * i >= len(rows):
                        self._cut()
                else:
                    self._cut()
            elif len(rows) - self._start > 4 * count + _SLACK:
                self._cut()
            return True
        strays = self._strays
        if strays:
            code = msg.code
            if _holds(strays.get(code), msg):
                del strays[code]
                return True
        return False

    def holds(self, msg: Held) -> bool:
        """``msg`` (a message as ``held`` gives it) is still indexed."""
        rows = self._rows
        i = msg.seq - self._base
        if 0 <= i < len(rows) and _holds(rows[i], msg):
            return True
        return bool(self._strays) and _holds(self._strays.get(msg.code), msg)

    def pop(self, code: str) -> Message | None:
        """Forget the message of ``code`` and return it (None: none)."""
        msg = self.get(code)
        if msg is not None:
            self.discard(msg)
        return msg

    def values(self) -> Iterator[Message]:
        """Every message, in sequence order (a copy: the index may change while it is walked),
        each ``Waiting`` made a ``Message``: for the walks that change messages."""
        return (msg.resolve() if type(msg) is Waiting else msg for msg in self._walk())

    def held(self) -> Iterator[Held]:
        """Every message as it is held (``Waiting.current``), in sequence order, a copy: for
        the walks that only read, which then make no ``Message`` of a ``Waiting``."""
        return map(_current, self._walk())

    def _walk(self) -> Iterator[Held]:
        start = self._start
        if len(self._rows) - start == self._count:  # no holes: recovery's million messages
            rows: Iterator[Held] = iter(self._rows[start:])  # type: ignore[arg-type]
        else:
            rows = (msg for msg in self._rows[start:] if msg is not None)
        if not self._strays:
            return rows
        return heapq.merge(sorted(self._strays.values(), key=_SEQ), rows, key=_SEQ)

    def newest_first(self) -> Iterator[Held]:
        """Every message as it is held, highest sequence number first (see ``held``)."""
        rows = (_current(msg) for msg in reversed(self._rows[self._start :]) if msg is not None)
        if not self._strays:
            return rows
        strays = sorted(map(_current, self._strays.values()), key=_SEQ, reverse=True)
        return heapq.merge(strays, rows, key=_SEQ, reverse=True)

    def items(self) -> Iterator[tuple[str, Message]]:
        return ((msg.code, msg) for msg in self.values())

    def _cut(self) -> None:
        """Step past the holes at the front; cut them off once they are half the list."""
        rows = self._rows
        start, n = self._start, len(rows)
        while start < n and rows[start] is None:
            start += 1
        if start == n:  # empty: the next message starts the list again
            rows.clear()
            self._start = 0
            return
        if start > _SLACK and start * 2 > n:
            del rows[:start]
            self._base += start
            start = 0
        elif n - start > 4 * self._count + _SLACK:
            # Mostly holes behind a few old messages: those become strays, and the holes go.
            half = start + (n - start) // 2
            self._stray(start, half)
            self._base += half
            start = 0
            while start < len(rows) and rows[start] is None:
                start += 1
        self._start = start

    def _stray(self, start: int, end: int) -> None:
        """Move the messages of ``rows[start:end]`` to the strays and cut ``rows[:end]`` off
        (the caller moves ``_base``)."""
        rows = self._rows
        for msg in rows[start:end]:
            if msg is not None:
                self._strays[msg.code] = msg
                self._count -= 1
        del rows[:end]


def _holds(held: Held | None, msg: Held) -> bool:
    """``held`` is ``msg``, or the ``Waiting`` it was made from."""
    return held is msg or (type(held) is Waiting and held.moved is msg)


def _current(held: Held) -> Held:
    return held.current() if type(held) is Waiting else held
