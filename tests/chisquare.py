"""Pearson's chi-square goodness-of-fit against equal shares, without scipy.

For an even number of degrees of freedom k the survival function has a closed form:
P(X > x) = exp(-x/2) · Σ_{i < k/2} (x/2)^i / i!  — enough for 3 or 5 bins (k = 2, 4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def chi_square_uniform_p(counts: Sequence[int]) -> float:
    """The p-value of ``counts`` under equal expected shares (an odd number of bins)."""
    bins = len(counts)
    df = bins - 1
    if bins < 2 or df % 2:
        raise ValueError("this closed form needs an odd number of bins (even degrees of freedom)")
    expected = sum(counts) / bins
    x = sum((c - expected) ** 2 / expected for c in counts)
    half = x / 2
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(df // 2))
