"""Helpers for testing Kapok and applications built on it (shipped, like aiohttp.test_utils)."""

from kapok.testing.clock import ManualClock
from kapok.testing.cluster import nodes_view, start_cluster, stop_all, wait_for
from kapok.testing.process import NodeProcess, start_node

__all__ = ["ManualClock", "NodeProcess", "nodes_view", "start_cluster", "start_node", "stop_all", "wait_for"]
