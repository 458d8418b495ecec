"""Lifeguard arithmetic: suspicion timeouts, local health, retransmit and push-pull scaling.

Pure functions of their arguments (``now`` included), following memberlist's formulas:

* suspicion minimum = ``mult × max(1, log10(max(1, n))) × probe_interval``; maximum =
  ``max_mult × minimum``. A fresh suspicion waits the maximum; every *independent*
  confirmation (a distinct node that also failed to reach the suspect, not the first accuser)
  shrinks the wait logarithmically, reaching the minimum after ``k = mult − 2`` of them
  (``k = 0`` — minimum at once — when the cluster is too small to ever gather them).
* local health (awareness): a saturating score ``0 .. max_multiplier − 1``; the probe round
  deadline is multiplied by ``score + 1``.
* each broadcast is sent ``retransmit_mult × ceil(log10(n + 1))`` times.
* the push-pull period grows with ``ceil(log2 n − log2 32) + 1`` above 32 members.
"""

from __future__ import annotations

import math

__all__ = [
    "Awareness",
    "Suspicion",
    "push_pull_scale",
    "retransmit_limit",
    "suspicion_k",
    "suspicion_max_s",
    "suspicion_min_s",
    "suspicion_timeout_s",
]


def suspicion_min_s(mult: int, n: int, probe_interval_s: float) -> float:
    return mult * max(1.0, math.log10(max(1, n))) * probe_interval_s


def suspicion_max_s(mult: int, max_mult: int, n: int, probe_interval_s: float) -> float:
    return max_mult * suspicion_min_s(mult, n, probe_interval_s)


def suspicion_k(mult: int, n: int) -> int:
    """Confirmations needed to reach the minimum timeout (0 when ``n − 2`` members cannot give them)."""
    k = mult - 2
    return 0 if n - 2 < k else max(k, 0)


def suspicion_timeout_s(min_s: float, max_s: float, k: int, confirmations: int) -> float:
    """Total time from the start of a suspicion to the dead declaration, after ``confirmations``."""
    if k < 1:
        return min_s
    frac = math.log(confirmations + 1) / math.log(k + 1)
    return max(min_s, max_s - (max_s - min_s) * frac)


def retransmit_limit(mult: int, n: int) -> int:
    return mult * math.ceil(math.log10(n + 1))


def push_pull_scale(interval_s: float, n: int) -> float:
    if n <= 32:
        return interval_s
    return interval_s * (math.ceil(math.log2(n) - math.log2(32)) + 1)


class Suspicion:
    """One running suspicion of one member at one incarnation.

    ``accuser`` started it and does not count as a confirmation; each further distinct
    source counts once, up to ``k``. ``deadline`` moves earlier as confirmations arrive.
    """

    __slots__ = ("_confirmers", "accuser", "incarnation", "k", "max_s", "min_s", "start")

    def __init__(
        self, accuser: str, incarnation: int, start: float, k: int, min_s: float, max_s: float
    ) -> None:
        self.accuser = accuser
        self.incarnation = incarnation
        self.start = start
        self.k = k
        self.min_s = min_s
        self.max_s = max_s
        self._confirmers: dict[str, None] = {}

    @property
    def confirmations(self) -> int:
        return len(self._confirmers)

    def confirm(self, source: str) -> bool:
        """Count ``source`` if it is new; True means the confirmation is news worth re-gossiping."""
        if len(self._confirmers) >= self.k or source == self.accuser or source in self._confirmers:
            return False
        self._confirmers[source] = None
        return True

    @property
    def deadline(self) -> float:
        return self.start + suspicion_timeout_s(self.min_s, self.max_s, self.k, len(self._confirmers))


class Awareness:
    """Lifeguard's local health score: high means "I may be the slow one", so wait longer."""

    __slots__ = ("max_multiplier", "score")

    def __init__(self, max_multiplier: int) -> None:
        self.max_multiplier = max(1, max_multiplier)
        self.score = 0

    def apply(self, delta: int) -> None:
        self.score = min(max(self.score + delta, 0), self.max_multiplier - 1)

    def scale(self, timeout_s: float) -> float:
        return timeout_s * (self.score + 1)
