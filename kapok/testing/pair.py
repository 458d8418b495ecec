"""A master and its slave as real ``kapok serve`` processes, for tests and the failover trial."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kapok.config import DEFAULT_SECRET_KEY
from kapok.launch import NodeProcess, cluster_sets, get_json, start_node, stop_all, wait_for
from kapok.testing.slow import scaled

__all__ = ["start_pair", "state_of"]

DEADLINE_S = scaled(30.0)  # for the slave to catch up (KAPOK_TEST_SLOW: kapok.testing.slow)


def start_pair(
    base: Path,
    *,
    mode: str,
    profile: str,
    failover_timeout_s: float,
    sets: tuple[str, ...] = (),
    seeds: tuple[str, ...] = (),
    launchers: tuple[Sequence[str], Sequence[str]] = (("-m", "kapok"), ("-m", "kapok")),
) -> tuple[NodeProcess, NodeProcess]:
    """A master and its slave, gossiping (through ``seeds``, else the master), the slave
    caught up. ``launchers`` start each (``kapok.faulty`` for fault injection)."""
    common = (f"replication.mode={mode}", f"replication.failover_timeout_s={failover_timeout_s}", *sets)
    master = start_node(
        base / "master", *cluster_sets(profile, seeds), "server.name=master", *common, launcher=launchers[0]
    )
    try:
        slave = start_node(
            base / "slave",
            *cluster_sets(profile, seeds or [master.gossip_addr]),
            "server.name=slave",
            "replication.role=slave",
            f"replication.master={master.url}",
            *common,
            launcher=launchers[1],
        )
    except BaseException:
        stop_all([master])
        raise
    try:
        wait_for(
            lambda: (s := state_of(master)).get("link_up") is True and bool(s.get("partner")),
            DEADLINE_S,
            0.05,
        )
    except BaseException:
        stop_all([master, slave])
        raise
    return master, slave


def state_of(node: NodeProcess | str, key: str = DEFAULT_SECRET_KEY) -> dict[str, Any]:
    """``GET /replication/state`` of a node (with its ``mq.secret_key``); {} when it does not
    answer or refuses the key."""
    state: dict[str, Any] = get_json(node, "/replication/state", key=key) or {}
    return state
