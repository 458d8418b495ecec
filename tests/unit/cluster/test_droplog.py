"""DropLog: when a packet dropped for its HMAC is worth a warning (plain numbers for time)."""

from __future__ import annotations

import pytest

from kapok.cluster.droplog import DropLog


def test_a_sender_is_named_at_its_first_drop_then_once_per_interval_with_its_count() -> None:
    log = DropLog(60.0)
    assert log.dropped("10.0.0.1:7946", 0.0) == 1
    assert [log.dropped("10.0.0.1:7946", t) for t in (1.0, 30.0, 59.9)] == [None, None, None]
    assert log.dropped("10.0.0.2:7946", 59.9) == 1  # another sender has its own window
    assert log.dropped("10.0.0.1:7946", 60.0) == 5
    assert log.dropped("10.0.0.1:7946", 119.9) is None
    assert log.dropped("10.0.0.1:7946", 120.0) == 7


def test_the_table_is_bounded_and_lets_go_of_senders_whose_window_has_passed() -> None:
    log = DropLog(10.0, max_senders=2)
    assert log.dropped("a", 0.0) == 1
    assert log.dropped("b", 5.0) == 1
    assert log.dropped("c", 6.0) is None  # full of fresh senders: unnamed, counted
    assert (log.unnamed, len(log)) == (1, 2)
    assert log.dropped("c", 10.0) == 1  # a's window has passed: a goes, c comes
    assert len(log) == 2
    assert log.dropped("a", 11.0) is None  # b and c are still fresh
    assert log.dropped("b", 15.0) == 2  # a warning moves b to the back...
    assert log.dropped("a", 20.0) == 1  # ...so c, the oldest warning now, is let go first
    assert log.dropped("b", 20.0) is None  # b stayed, its window still open


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        DropLog(-1.0)
    with pytest.raises(ValueError):
        DropLog(1.0, max_senders=0)
