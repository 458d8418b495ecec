"""The reconnect delay: exponential, capped, with full jitter — as a table."""

from __future__ import annotations

import pytest

from kapok.client.backoff import backoff_delay


@pytest.mark.parametrize(
    ("attempt", "base_s", "cap_s", "rand", "expected"),
    [
        (0, 0.1, 5.0, 0.0, 0.0),  # full jitter reaches down to zero
        (0, 0.1, 5.0, 0.5, 0.05),
        (1, 0.1, 5.0, 0.5, 0.1),
        (2, 0.1, 5.0, 0.5, 0.2),
        (3, 0.1, 5.0, 0.999, 0.7992),
        (5, 0.1, 5.0, 0.5, 1.6),
        (6, 0.1, 5.0, 0.5, 2.5),  # 6.4 capped at 5
        (10, 0.1, 5.0, 0.5, 2.5),
        (1000, 0.1, 5.0, 0.5, 2.5),  # no overflow for absurd attempts
        (3, 1.0, 0.0, 0.9, 0.0),  # a zero cap means retry at once
        (4, 0.0, 5.0, 0.9, 0.0),
    ],
)
def test_backoff_table(attempt: int, base_s: float, cap_s: float, rand: float, expected: float) -> None:
    assert backoff_delay(attempt, base_s=base_s, cap_s=cap_s, rand=rand) == pytest.approx(expected)


def test_backoff_grows_until_the_cap() -> None:
    ceilings = [backoff_delay(n, base_s=0.05, cap_s=5.0, rand=0.999999) for n in range(12)]
    assert ceilings == sorted(ceilings)
    assert ceilings[0] < 0.051 and ceilings[-1] == pytest.approx(5.0, rel=1e-5)


@pytest.mark.parametrize(
    ("attempt", "base_s", "cap_s", "rand"),
    [(-1, 0.1, 5.0, 0.5), (0, -0.1, 5.0, 0.5), (0, 0.1, -5.0, 0.5), (0, 0.1, 5.0, 1.0), (0, 0.1, 5.0, -0.1)],
)
def test_backoff_rejects_bad_arguments(attempt: int, base_s: float, cap_s: float, rand: float) -> None:
    with pytest.raises(ValueError):
        backoff_delay(attempt, base_s=base_s, cap_s=cap_s, rand=rand)
