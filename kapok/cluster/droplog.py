"""When a dropped, unauthenticated gossip packet deserves a log line (pure: ``now`` comes in).

A node whose ``cluster.secret`` differs from the cluster's is invisible: its packets fail the
HMAC wherever they arrive and are only counted. ``DropLog`` turns those drops into a warning
that names the sender — at most once per sender per ``interval_s``, with how many came from
it so far — so that the misconfiguration shows up in the log without a stream of bad packets
(or of spoofed source addresses, each a sender of its own) flooding it.

The table is bounded by ``max_senders``. Its dict order is the order of the last warning, so
the senders whose window has passed are at the front and are let go first, and only when
the table is full; a new sender that finds it full of fresh ones goes unnamed (counted in
``unnamed``), so the warnings stay bounded at ``max_senders`` per ``interval_s``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DropLog"]

MAX_SENDERS: Final = 256


class _Sender:
    __slots__ = ("dropped", "warned_at")

    def __init__(self, now: float) -> None:
        self.dropped = 0
        self.warned_at = now


class DropLog:
    """Per-sender counts of dropped packets, and when each sender is next worth a warning."""

    def __init__(self, interval_s: float, max_senders: int = MAX_SENDERS) -> None:
        if interval_s < 0 or max_senders < 1:
            raise ValueError("interval_s must be ≥ 0 and max_senders ≥ 1")
        self.interval_s = interval_s
        self.max_senders = max_senders
        self.unnamed = 0  # drops from senders the full table had no room for
        self._senders: dict[str, _Sender] = {}

    def __len__(self) -> int:
        return len(self._senders)

    def dropped(self, sender: str, now: float) -> int | None:
        """Count one packet dropped from ``sender``. Returns how many have been dropped from it
        so far when a warning is due (the first drop, then once per ``interval_s``), else None."""
        senders = self._senders
        entry = senders.get(sender)
        if entry is None:
            if len(senders) >= self.max_senders and not self._let_go(now):
                self.unnamed += 1
                return None
            entry = senders[sender] = _Sender(now)
        elif now - entry.warned_at < self.interval_s:
            entry.dropped += 1
            return None
        else:
            entry.warned_at = now
            del senders[sender]  # to the back: the front stays the oldest warning
            senders[sender] = entry
        entry.dropped += 1
        return entry.dropped

    def _let_go(self, now: float) -> bool:
        """Forget the senders whose window has passed (all at the front); True if any were."""
        senders = self._senders
        horizon = now - self.interval_s
        freed = False
        while senders:
            oldest = next(iter(senders))
            if senders[oldest].warned_at > horizon:
                break
            del senders[oldest]
            freed = True
        return freed
