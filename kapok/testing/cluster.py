"""Start several real ``kapok serve`` processes as one gossip cluster, and poll its views.

``start_cluster`` starts the first node, then the others at once (each in its own thread,
so start-up costs one node's time, not n), all joining through the first node's gossip
address. Every node gets port 0 for HTTP and gossip, ``cluster.profile`` as asked, and its
own working directory. The caller stops what it got (``stop_all``), by PID.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kapok.testing.process import NodeProcess, start_node

__all__ = ["cluster_sets", "nodes_view", "start_cluster", "stop_all", "wait_for"]


def cluster_sets(profile: str = "fast", seeds: Sequence[str] = ()) -> list[str]:
    """``--set`` items for a gossip node on loopback, port 0."""
    sets = ["cluster.enabled=true", "cluster.bind=127.0.0.1:0", f"cluster.profile={profile}"]
    if seeds:
        sets.append(f"cluster.seeds=[{', '.join(seeds)}]")
    return sets


def start_cluster(
    base: Path,
    count: int,
    *sets: str,
    profile: str = "fast",
    node_sets: Callable[[int], Sequence[str]] = lambda i: (),
    launcher: Callable[[int], Sequence[str]] = lambda i: ("-m", "kapok"),
) -> list[NodeProcess]:
    """``count`` nodes in ``base/node<i>``; node 0 is every other node's seed."""
    first = start_node(base / "node0", *cluster_sets(profile), *sets, *node_sets(0), launcher=launcher(0))
    nodes = [first]
    try:
        seed = first.gossip_addr

        def start(i: int) -> NodeProcess:
            node_args = (*cluster_sets(profile, [seed]), *sets, *node_sets(i))
            return start_node(base / f"node{i}", *node_args, launcher=launcher(i))

        with ThreadPoolExecutor(max_workers=max(1, count - 1)) as pool:
            futures = [pool.submit(start, i) for i in range(1, count)]
        nodes.extend(f.result() for f in futures if f.exception() is None)  # all, to stop them on failure
        for future in futures:
            future.result()  # the first start-up failure, if any
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def stop_all(nodes: Sequence[NodeProcess]) -> None:
    for node in nodes:
        node.stop()


def nodes_view(node: NodeProcess, timeout_s: float = 2.0) -> dict[str, dict[str, Any]]:
    """``GET /cluster/nodes`` of one node, by member name; {} when it does not answer."""
    try:
        with urllib.request.urlopen(node.url + "/cluster/nodes", timeout=timeout_s) as response:
            rows: list[dict[str, Any]] = json.loads(response.read())
    except OSError:
        return {}
    return {row["name"]: row for row in rows}


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> float:
    """Poll ``condition`` until true; return the seconds it took. TimeoutError past the deadline."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start
