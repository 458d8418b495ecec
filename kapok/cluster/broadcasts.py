"""The retransmit-limited broadcast queue that feeds piggybacking and gossip (pure).

Each queued membership update is kept as its encoded bytes and sent at most ``limit``
times (``retransmit_mult × ceil(log10(n + 1))``, computed by the caller as the cluster
grows or shrinks). When a packet has room for only some updates, the least transmitted go
first and, among those, the newest: fresh news spreads fastest, as in SWIM's infection-style
dissemination. A newer update about the same member replaces the older one, so the queue
holds at most one entry per member and is bounded by the membership itself.
"""

from __future__ import annotations

from typing import Final

__all__ = ["TransmitQueue"]

# Stop looking for something that still fits after this many misses in one take.
_MAX_MISSES: Final = 32


class _Item:
    __slots__ = ("data", "key", "seq", "transmits")

    def __init__(self, key: str, data: bytes, seq: int) -> None:
        self.key = key
        self.data = data
        self.seq = seq
        self.transmits = 0


class TransmitQueue:
    def __init__(self) -> None:
        self._by_key: dict[str, _Item] = {}
        # _buckets[t] holds the items sent t times, keyed by insertion seq (oldest first).
        self._buckets: list[dict[int, _Item]] = [{}]
        self._seq = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def push(self, key: str, data: bytes) -> None:
        old = self._by_key.pop(key, None)
        if old is not None:
            del self._buckets[old.transmits][old.seq]
        self._seq += 1
        item = _Item(key, data, self._seq)
        self._by_key[key] = item
        self._buckets[0][item.seq] = item

    def take(self, budget: int, limit: int) -> list[bytes]:
        """Updates whose encodings, each plus one separator byte, fit in ``budget`` bytes."""
        buckets = self._buckets
        while len(buckets) > max(limit, 1):  # the limit shrank: over-sent items retire
            for item in buckets.pop().values():
                del self._by_key[item.key]
        if not self._by_key or budget <= 1:
            return []
        chosen: list[_Item] = []
        misses = 0
        for bucket in buckets:
            if not bucket:
                continue
            for item in reversed(bucket.values()):
                cost = len(item.data) + 1
                if cost <= budget:
                    chosen.append(item)
                    budget -= cost
                    if budget < 2:
                        break
                else:
                    misses += 1
                    if misses > _MAX_MISSES:
                        break
            if budget < 2 or misses > _MAX_MISSES:
                break
        for item in chosen:
            del buckets[item.transmits][item.seq]
            item.transmits += 1
            if item.transmits >= limit:
                del self._by_key[item.key]
                continue
            if item.transmits == len(buckets):
                buckets.append({})
            buckets[item.transmits][item.seq] = item
        return [item.data for item in chosen]

    def clear(self) -> None:
        self._by_key.clear()
        self._buckets = [{}]
