"""Helpers for testing Kapok and applications built on it (shipped, like aiohttp.test_utils)."""

from kapok.testing.clock import ManualClock
from kapok.testing.process import NodeProcess, start_node

__all__ = ["ManualClock", "NodeProcess", "start_node"]
