"""Token buckets, the per-producer rate limiter and the duplicate window."""

from __future__ import annotations

import pytest

from kapok.core.limits import DedupWindow, RateLimiter, TokenBucket

# ---------------------------------------------------------------- TokenBucket


def test_bucket_starts_full_and_empties() -> None:
    bucket = TokenBucket(rate=1.0, burst=3, now=100.0)
    assert [bucket.take(1, 100.0) for _ in range(4)] == [True, True, True, False]


def test_bucket_refills_at_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=4, now=0.0)
    assert bucket.take(4, 0.0)
    assert not bucket.take(1, 0.0)
    assert not bucket.take(1, 0.25)  # 0.5 tokens
    assert bucket.take(1, 0.5)  # 1.0 tokens
    assert not bucket.take(1, 0.5)
    assert bucket.take(2, 1.5)  # 2.0 tokens
    assert not bucket.take(1, 1.5)


def test_bucket_caps_saved_tokens_at_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=5, now=0.0)
    assert bucket.take(5, 0.0)
    # an hour idle earns 36000 tokens, but only `burst` are saved
    assert not bucket.take(6, 3600.0)
    assert bucket.take(5, 3600.0)
    assert not bucket.take(1, 3600.0)


def test_refused_take_costs_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=3, now=0.0)
    assert not bucket.take(4, 0.0)
    assert bucket.tokens == 3
    assert bucket.take(3, 0.0)
    assert bucket.tokens == 0
    assert not bucket.take(1, 0.5)
    assert bucket.tokens == pytest.approx(0.5)
    assert bucket.take(1, 1.0)


def test_bucket_ignores_a_clock_stepping_back() -> None:
    bucket = TokenBucket(rate=1.0, burst=2, now=10.0)
    assert bucket.take(2, 10.0)
    assert not bucket.take(1, 5.0)  # earlier time earns nothing
    assert bucket.tokens == 0
    assert bucket.take(1, 11.0)


def test_bucket_larger_than_burst_never_fits() -> None:
    bucket = TokenBucket(rate=100.0, burst=3, now=0.0)
    assert not bucket.take(4, 1000.0)
    assert bucket.take(3, 1000.0)


# ---------------------------------------------------------------- RateLimiter


def test_limiter_disabled_when_rate_is_zero() -> None:
    limiter = RateLimiter(rate=0.0, burst=1)
    assert not limiter.enabled
    assert all(limiter.allow("p", 1000, 0.0) for _ in range(100))


def test_limiter_is_per_producer() -> None:
    limiter = RateLimiter(rate=1.0, burst=2)
    assert limiter.enabled
    assert limiter.allow("a", 2, 0.0)
    assert not limiter.allow("a", 1, 0.0)
    # another producer has its own full bucket
    assert limiter.allow("b", 2, 0.0)
    assert not limiter.allow("b", 1, 0.0)
    # and each refills on its own
    assert limiter.allow("a", 1, 1.0)
    assert not limiter.allow("a", 1, 1.0)
    assert limiter.allow("b", 1, 1.0)


def test_limiter_burst_is_at_least_one() -> None:
    limiter = RateLimiter(rate=1.0, burst=0)
    assert limiter.allow("p", 1, 0.0)
    assert not limiter.allow("p", 1, 0.0)


def test_limiter_evicts_least_recently_used_producer() -> None:
    limiter = RateLimiter(rate=0.001, burst=1, max_producers=2)
    assert limiter.allow("a", 1, 0.0)
    assert limiter.allow("b", 1, 0.0)
    # "a" used again: now "b" is the least recently used
    assert not limiter.allow("a", 1, 0.0)
    assert limiter.allow("c", 1, 0.0)  # evicts "b"; "a" (still empty) is kept
    assert not limiter.allow("a", 1, 0.0)
    # "b" comes back with a fresh, full bucket and evicts "c" (LRU after "a" was used)
    assert limiter.allow("b", 1, 0.0)
    assert not limiter.allow("a", 1, 0.0)
    assert not limiter.allow("b", 1, 0.0)
    assert limiter.allow("c", 1, 0.0)  # "c" was evicted: fresh bucket


def test_limiter_memory_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_producers=10)
    for i in range(1000):
        limiter.allow(f"p{i}", 1, 0.0)
    assert len(limiter._buckets) == 10


# ---------------------------------------------------------------- DedupWindow


def test_dedup_remembers_within_window() -> None:
    window = DedupWindow(window_s=10.0, max_entries=100)
    assert window.get("t", "d1", 0.0) is None
    window.add("t", "d1", "code1", 0.0)
    assert window.get("t", "d1", 0.0) == "code1"
    assert window.get("t", "d1", 9.999) == "code1"
    assert len(window) == 1


def test_dedup_forgets_when_window_passes() -> None:
    window = DedupWindow(window_s=10.0, max_entries=100)
    window.add("t", "d1", "code1", 0.0)
    window.add("t", "d2", "code2", 5.0)
    assert window.get("t", "d1", 10.0) is None  # exactly window_s later: gone
    assert window.get("t", "d2", 10.0) == "code2"
    assert len(window) == 1
    window.expire(15.0)
    assert len(window) == 0
    assert window.get("t", "d2", 15.0) is None


def test_dedup_key_is_per_topic() -> None:
    window = DedupWindow(window_s=10.0, max_entries=100)
    window.add("t1", "d", "c1", 0.0)
    assert window.get("t2", "d", 0.0) is None
    window.add("t2", "d", "c2", 0.0)
    assert window.get("t1", "d", 1.0) == "c1"
    assert window.get("t2", "d", 1.0) == "c2"


def test_dedup_evicts_oldest_past_max_entries() -> None:
    window = DedupWindow(window_s=1000.0, max_entries=3)
    for i in range(5):
        window.add("t", f"d{i}", f"c{i}", float(i))
    assert len(window) == 3
    assert window.get("t", "d0", 5.0) is None
    assert window.get("t", "d1", 5.0) is None
    assert [window.get("t", f"d{i}", 5.0) for i in (2, 3, 4)] == ["c2", "c3", "c4"]


def test_dedup_items_snapshot() -> None:
    window = DedupWindow(window_s=10.0, max_entries=3)
    window.add("t", "a", "ca", 1.0)
    window.add("u", "b", "cb", 2.0)
    window.add("t", "c", "cc", 3.0)
    window.add("t", "d", "cd", 4.0)  # evicts "a"
    assert window.items() == [(2.0, "u", "b", "cb"), (3.0, "t", "c", "cc"), (4.0, "t", "d", "cd")]
    window.expire(12.0)  # horizon 2.0: "b" leaves
    assert window.items() == [(3.0, "t", "c", "cc"), (4.0, "t", "d", "cd")]


def test_dedup_readd_keeps_one_entry() -> None:
    window = DedupWindow(window_s=10.0, max_entries=10)
    window.add("t", "a", "c1", 0.0)
    window.add("t", "a", "c2", 1.0)
    assert len(window) == 1
    assert window.items() == [(0.0, "t", "a", "c2")]


def test_retention_queue_pops_what_is_due_per_period_and_caps_the_count() -> None:
    from kapok.core.timers import RetentionQueue

    q: RetentionQueue[str] = RetentionQueue(max_items=3)
    q.add(10.0, 10.0, "a")  # period 10 s, due at 10
    q.add(5.0, 1.0, "b")  # period 1 s, due at 5
    q.add(11.0, 10.0, "c")
    assert len(q) == 3 and q.next_due() == 5.0
    assert q.pop_due(4.0) == []
    assert sorted(q.pop_due(10.0)) == ["a", "b"]
    assert len(q) == 1 and q.next_due() == 11.0
    for i in range(4):
        q.add(20.0 + i, 10.0, f"x{i}")
    assert q.pop_due(0.0) == ["c", "x0"]  # over the cap: the earliest go early
    assert len(q) == 3
