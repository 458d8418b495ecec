"""Lifeguard arithmetic against the values memberlist's formulas give for the ``lan``
profile, and the broadcast queue's retransmit bookkeeping."""

from __future__ import annotations

import pytest

from kapok.cluster.broadcasts import TransmitQueue
from kapok.cluster.suspicion import (
    Awareness,
    Suspicion,
    push_pull_scale,
    retransmit_limit,
    suspicion_k,
    suspicion_max_s,
    suspicion_min_s,
    suspicion_timeout_s,
)

# N, suspicion min, suspicion max, k, retransmits, push-pull period — LAN defaults.
LAN_TABLE = [
    (3, 4.0, 24.0, 0, 4, 30.0),
    (10, 4.0, 24.0, 2, 8, 30.0),
    (100, 8.0, 48.0, 2, 12, 90.0),
    (200, 9.2, 55.2, 2, 12, 120.0),
    (1000, 12.0, 72.0, 2, 16, 180.0),
]


@pytest.mark.parametrize(("n", "lo", "hi", "k", "retransmits", "push_pull"), LAN_TABLE)
def test_lan_derived_values(n: int, lo: float, hi: float, k: int, retransmits: int, push_pull: float) -> None:
    assert suspicion_min_s(4, n, 1.0) == pytest.approx(lo, abs=0.05)
    assert suspicion_max_s(4, 6, n, 1.0) == pytest.approx(hi, abs=0.3)
    assert suspicion_k(4, n) == k
    assert retransmit_limit(4, n) == retransmits
    assert push_pull_scale(30.0, n) == push_pull


@pytest.mark.parametrize(("confirmations", "expected"), [(0, 48.0), (1, 22.8), (2, 8.0), (3, 8.0)])
def test_timeout_falls_with_confirmations_at_n100(confirmations: int, expected: float) -> None:
    # memberlist's formula at N = 100: 48 s, 22.8 s, 8 s.
    assert suspicion_timeout_s(8.0, 48.0, 2, confirmations) == pytest.approx(expected, abs=0.05)


@pytest.mark.parametrize(
    ("k", "confirmations", "expected"),
    [(0, 0, 10.0), (0, 5, 10.0), (1, 0, 60.0), (1, 1, 10.0), (3, 1, 35.0), (3, 3, 10.0)],
)
def test_timeout_table(k: int, confirmations: int, expected: float) -> None:
    assert suspicion_timeout_s(10.0, 60.0, k, confirmations) == pytest.approx(expected)


def test_small_and_odd_sizes() -> None:
    assert suspicion_min_s(4, 0, 1.0) == 4.0  # log10 of nothing: the floor of 1 applies
    assert suspicion_k(4, 4) == 2 and suspicion_k(4, 3) == 0
    assert suspicion_k(2, 100) == 0  # mult 2 leaves no confirmations to wait for
    assert retransmit_limit(4, 1) == 4 and retransmit_limit(2, 9) == 2
    assert push_pull_scale(30.0, 32) == 30.0 and push_pull_scale(30.0, 33) == 60.0


def test_confirmations_count_distinct_sources_only() -> None:
    s = Suspicion("accuser", incarnation=3, start=100.0, k=2, min_s=8.0, max_s=48.0)
    assert s.deadline == pytest.approx(148.0)
    assert not s.confirm("accuser")  # the accuser is not a confirmation
    assert s.confirm("b")
    assert not s.confirm("b")  # nor is a repeat
    assert s.deadline == pytest.approx(122.8, abs=0.05)
    assert s.confirm("c")
    assert s.deadline == pytest.approx(108.0)
    assert not s.confirm("d")  # k reached: nothing more to gain, nothing to re-gossip
    assert s.confirmations == 2


def test_awareness_saturates_and_scales() -> None:
    a = Awareness(8)
    a.apply(-1)
    assert a.score == 0 and a.scale(1.0) == 1.0
    a.apply(3)
    assert a.scale(0.5) == 2.0
    a.apply(100)
    assert a.score == 7 and a.scale(1.0) == 8.0
    a.apply(-2)
    assert a.score == 5
    off = Awareness(1)  # Lifeguard off: never scales
    off.apply(5)
    assert off.scale(1.0) == 1.0


# ---------------------------------------------------------------- TransmitQueue


def test_queue_sends_each_update_limit_times() -> None:
    q = TransmitQueue()
    q.push("a", b"AA")
    sent = [q.take(100, limit=3) for _ in range(5)]
    assert sent == [[b"AA"], [b"AA"], [b"AA"], [], []]
    assert "a" not in q and len(q) == 0


def test_newer_update_about_a_member_replaces_the_older() -> None:
    q = TransmitQueue()
    q.push("a", b"old")
    q.take(100, limit=4)
    q.push("a", b"new")
    assert len(q) == 1
    assert q.take(100, limit=4) == [b"new"]


def test_least_transmitted_first_then_newest() -> None:
    q = TransmitQueue()
    q.push("a", b"a")
    q.take(100, limit=9)  # a: sent once
    q.push("b", b"b")
    q.push("c", b"c")
    assert q.take(4, limit=9) == [b"c", b"b"]  # budget for two: the never-sent ones, newest first
    q.push("d", b"d")
    assert q.take(2, limit=9) == [b"d"]  # room for one: the never-sent one


def test_budget_counts_a_separator_per_item_and_skips_what_does_not_fit() -> None:
    q = TransmitQueue()
    q.push("big", b"x" * 50)
    q.push("small", b"y" * 5)
    assert q.take(10, limit=4) == [b"y" * 5]
    assert q.take(51, limit=4) == [b"x" * 50]
    assert q.take(1, limit=4) == []


def test_shrinking_limit_retires_over_sent_items() -> None:
    q = TransmitQueue()
    q.push("a", b"a")
    for _ in range(3):
        q.take(10, limit=8)
    assert q.take(10, limit=2) == []
    assert len(q) == 0
