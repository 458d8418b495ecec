"""Reconnect delays: exponential backoff with a cap and full jitter (pure).

Full jitter (a uniform draw in ``[0, min(cap, base · 2^attempt)]``) rather than a fixed
delay plus a little noise: when a node dies, every client of it reconnects at once, and
spreading them over the whole window is what keeps the survivors and the returning node
from being hit by synchronized waves. The caller passes the random draw, so the function
is a plain table of numbers to test.
"""

from __future__ import annotations

__all__ = ["backoff_delay"]

# 2**62 × any sane base is far beyond any cap: larger attempts change nothing but risk
# an OverflowError in the float power.
_MAX_EXPONENT = 62


def backoff_delay(attempt: int, *, base_s: float, cap_s: float, rand: float) -> float:
    """Seconds to wait before retry number ``attempt`` (0 = the first retry).

    ``rand`` is a draw from ``[0, 1)``; the result lies in ``[0, min(cap_s, base_s · 2^attempt))``.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if base_s < 0 or cap_s < 0:
        raise ValueError("base_s and cap_s must not be negative")
    if not 0.0 <= rand < 1.0:
        raise ValueError(f"rand must be in [0, 1), got {rand}")
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt, _MAX_EXPONENT))
    return ceiling * rand
