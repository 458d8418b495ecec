"""Rate limits and the duplicate filter (pure: ``now`` is always an argument).

Both structures are bounded in entries so that no producer behaviour can
grow the broker's memory without limit.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

__all__ = ["DedupWindow", "RateLimiter", "TokenBucket"]


class TokenBucket:
    """Classic token bucket: ``rate`` tokens per second, at most ``burst`` saved."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, n: int, now: float) -> bool:
        """Take ``n`` tokens if there are that many; a refused take costs nothing."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


class RateLimiter:
    """One token bucket per producer id, the least recently used evicted past ``max_producers``."""

    def __init__(self, rate: float, burst: int, max_producers: int = 100_000) -> None:
        self.rate = rate
        self.burst = max(burst, 1)
        self.max_producers = max_producers
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def allow(self, producer_id: str, n: int, now: float) -> bool:
        if self.rate <= 0:
            return True
        bucket = self._buckets.get(producer_id)
        if bucket is None:
            bucket = self._buckets[producer_id] = TokenBucket(self.rate, self.burst, now)
            if len(self._buckets) > self.max_producers:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(producer_id)
        return bucket.take(n, now)


class DedupWindow:
    """Remembers ``(topic, dedup_id) -> code`` for ``window_s`` seconds.

    The window is independent of the message's own lifetime: a consumed and
    forgotten message's id still answers a late retry with its code. Entries
    leave in insertion order, which is also time order because ``now`` never
    goes backwards for a given broker; a clock that does step back only makes
    entries live a little longer.
    """

    def __init__(self, window_s: float, max_entries: int) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._codes: dict[tuple[str, str], str] = {}
        self._order: deque[tuple[float, tuple[str, str]]] = deque()

    def __len__(self) -> int:
        return len(self._codes)

    def get(self, topic: str, dedup_id: str, now: float) -> str | None:
        self.expire(now)
        return self._codes.get((topic, dedup_id))

    def known(self, now: float) -> Callable[[tuple[str, str]], str | None]:
        """Expire, then a lookup of ``(topic, dedup_id)`` keys for the rest of one batch."""
        self.expire(now)
        return self._codes.get

    def add_many(self, entries: list[tuple[tuple[str, str], str]], now: float) -> None:
        """``add`` for a batch's ``((topic, dedup_id), code)`` pairs."""
        codes, order = self._codes, self._order
        for key, code in entries:
            if key not in codes:
                order.append((now, key))
            codes[key] = code
        while len(codes) > self.max_entries:
            _, old = order.popleft()
            codes.pop(old, None)

    def add(self, topic: str, dedup_id: str, code: str, now: float) -> None:
        key = (topic, dedup_id)
        if key not in self._codes:
            self._order.append((now, key))
        self._codes[key] = code
        while len(self._codes) > self.max_entries:
            _, old = self._order.popleft()
            self._codes.pop(old, None)

    def expire(self, now: float) -> None:
        horizon = now - self.window_s
        order = self._order
        while order and order[0][0] <= horizon:
            _, key = order.popleft()
            self._codes.pop(key, None)

    def items(self) -> list[tuple[float, str, str, str]]:
        """``(added_at, topic, dedup_id, code)`` for every live entry (snapshots)."""
        return [(t, k[0], k[1], self._codes[k]) for t, k in self._order if k in self._codes]
