"""Helpers for testing Kapok and applications built on it (shipped, like aiohttp.test_utils).

Real ``kapok serve`` processes are started by ``kapok.launch``, which shipped tools use too.
"""

from kapok.testing.clock import ManualClock
from kapok.testing.poll import eventually

__all__ = ["ManualClock", "eventually"]
