"""When the node polls its sockets instead of sleeping (``kapok.server.busypoll.SpinRule``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kapok.server.busypoll import SpinRule

W = 0.000_2  # the default window, 200 µs


def feed(rule: SpinRule, gaps: list[float], start: float = 100.0) -> list[float | None]:
    out, now = [], start
    for gap in gaps:
        now += gap
        out.append(rule.heard(now))
    return out


def test_a_fresh_node_does_not_poll_on_its_first_data() -> None:
    assert SpinRule(W).heard(100.0) is None


def test_one_request_at_a_time_polls_for_a_window_after_each() -> None:
    rule = SpinRule(W)
    answers = feed(rule, [W / 2] * 20)
    assert answers[-1] == pytest.approx(100.0 + 20 * W / 2 + W)  # the window from the latest data
    assert all(until is not None for until in answers[10:])


def test_a_trickle_never_polls() -> None:
    # A message every 2 ms (2,000 msg/s with its ack between: gaps of ~0.25 ms) stays out.
    assert feed(SpinRule(W), [0.002] * 200) == [None] * 200
    assert feed(SpinRule(W), [W * 0.5, W * 2.0] * 100) == [None] * 200


def test_after_an_idle_spell_a_few_dense_gaps_start_it_again() -> None:
    rule = SpinRule(W)
    feed(rule, [W / 4] * 50)
    assert feed(rule, [3600.0]) == [None]  # an hour of silence counts as a few windows
    answers = feed(rule, [W / 4] * 12, start=4000.0)
    assert answers[0] is None and answers[-1] is not None


@given(st.lists(st.floats(min_value=W, max_value=10.0), min_size=1, max_size=100))
def test_gaps_of_a_window_or_more_never_poll(gaps: list[float]) -> None:
    assert all(until is None for until in feed(SpinRule(W), gaps))


def test_a_window_that_passes_in_vain_needs_a_new_run_of_dense_gaps() -> None:
    rule = SpinRule(W)
    assert feed(rule, [W / 4] * 30)[-1] is not None
    rule.missed()
    answers = feed(rule, [W / 4] * 12, start=200.0)
    assert answers[:4] == [None] * 4 and answers[-1] is not None
