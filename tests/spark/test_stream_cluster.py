"""Acceptance 3: a topic spread over two masters by ``kapok produce``, read as a Spark stream
into the file sink; a kill -9 of one master mid-stream and its slave's takeover, then the
master's return and the give-back; the query goes on by itself, and every id is in the
sink exactly once.

Real ``kapok serve`` processes (m1 with its slave s1, and m2), a real local SparkSession.
Counts are asserted; times are printed (``pytest -s``), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kapok.launch import NodeProcess, get_json, nodes_view, stop_all, wait_for
from kapok.local_cluster import plan_cluster, start_planned, start_plans
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

DEADLINE_S = scaled(60.0)
TOPIC = "spread"
FIRST, SECOND, THIRD = 3000, 1000, 1000  # ids before the query, after the takeover, after the give-back


class Cluster:
    """m1 with its slave s1 (sync replication), and m2 without one; m2 is the gossip seed,
    so a restarted m1 finds the others."""

    def __init__(self, base: Path) -> None:
        plans = [plan for plan in plan_cluster(2, slaves=True) if plan.name != "s2"]
        self.base, self.plans = base, sorted(plans, key=lambda plan: plan.name != "m2")
        self.nodes = dict(zip([p.name for p in self.plans], start_plans(base, self.plans), strict=True))

    def restart(self, name: str) -> NodeProcess:
        """Start ``name`` again: same name, ports and data."""
        [plan] = [p for p in self.plans if p.name == name]
        self.nodes[name] = start_planned(self.base, plan, self.plans)
        return self.nodes[name]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "nodes")
    try:
        wait_for(lambda: _paired(made.nodes["m1"]) and _all_seen(list(made.nodes.values())), DEADLINE_S, 0.1)
        yield made
    finally:
        stop_all(list(made.nodes.values()))


def _paired(node: NodeProcess) -> bool:
    state = get_json(node.url, "/replication/state", key="test") or {}
    return bool(state.get("link_up")) and state.get("role") == "leader"


def _all_seen(nodes: list[NodeProcess]) -> bool:
    return all(len(nodes_view(n)) == len(nodes) for n in nodes)


def _produce(seeds: list[str], first: int, count: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    lines = "".join(f"id{i}\n" for i in range(first, first + count))
    args = [arg for seed in seeds for arg in ("--seed", seed)]
    command = [sys.executable, "-m", "kapok", "produce", *args, "--topic", TOPIC]
    done = subprocess.run(
        command, input=lines, capture_output=True, text=True, timeout=scaled(120), env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"confirmed {count}" in done.stderr, done.stderr


def _live(node: NodeProcess) -> int:
    stats: dict[str, Any] = get_json(node.url, f"/v1/topics/{TOPIC}", key="test") or {}
    return int(stats.get("live", 0))


def _ids(spark: SparkSession, out: Path) -> list[str]:
    if not (out / "_spark_metadata").exists():
        return []
    return [
        r["text"] for r in spark.read.parquet(str(out)).selectExpr("CAST(data AS STRING) AS text").collect()
    ]


def _batches_with(query: StreamingQuery, pair: str) -> list[float]:
    """When each finished batch that read ``pair`` ended (unix seconds)."""
    ends = []
    for progress in query.recentProgress:
        offsets = progress["sources"][0].get("endOffset") or "{}"
        offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
        if pair in (offsets.get("pairs") or {}) and progress.get("numInputRows"):
            started = (
                time.mktime(time.strptime(progress["timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            )
            ends.append(started + progress["durationMs"]["triggerExecution"] / 1000)
    return ends


def _active(node: NodeProcess) -> bool:
    return (get_json(node.url, "/health") or {}).get("active") is True


def _wait_sink(spark: SparkSession, query: StreamingQuery, out: Path, total: int) -> None:
    deadline = time.monotonic() + scaled(180)
    while len(seen := _ids(spark, out)) < total:
        assert query.isActive and query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{len(seen)} of {total} in the sink"
        time.sleep(0.5)


def test_a_query_reads_both_masters_and_goes_on_through_a_takeover_and_the_give_back(
    spark: SparkSession, cluster: Cluster, tmp_path: Path
) -> None:
    m1, m2, s1 = cluster.nodes["m1"], cluster.nodes["m2"], cluster.nodes["s1"]
    _produce([m1.url, m2.url], 0, FIRST)
    on_m1, on_m2 = _live(m1), _live(m2)
    assert on_m1 > 0 and on_m2 > 0 and on_m1 + on_m2 == FIRST  # spread over both masters
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (
        spark.readStream.format("kapok")
        .option("seeds", m2.url)  # one seed: the source finds m1 and its slave itself
        .option("topic", TOPIC)
        .option("maxMessagesPerBatch", "200")
        .option("timeoutSeconds", f"{scaled(5):g}")
        .load()
        .select("code", "data")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        # Mid-stream: a few batches in, much of m1's share still to read.
        wait_for(
            lambda: len(_batches_with(query, "m1")) >= 2 or query.exception() is not None, DEADLINE_S, 0.1
        )
        assert query.exception() is None
        before_kill = len(_ids(spark, out))
        killed_at = time.time()
        m1.kill()
        assert before_kill < FIRST
        wait_for(lambda: _active(s1), DEADLINE_S, 0.05)
        taken_s = time.time() - killed_at
        _produce([m2.url, s1.url], FIRST, SECOND)  # more while the query runs, after the takeover
        _wait_sink(spark, query, out, FIRST + SECOND)
        after = [end for end in _batches_with(query, "m1") if end > killed_at]
        assert after, "no batch read m1's pair after the kill"
        went_on_s = after[0] - killed_at
        # m1 comes back, catches up with s1 and takes its role back (the give-back).
        m1 = cluster.restart("m1")
        wait_for(lambda: _active(m1) and (get_json(s1.url, "/health") or {}).get("role") == "slave",
                 DEADLINE_S, 0.1)  # fmt: skip
        back_at = time.time()
        _produce([m1.url, m2.url], FIRST + SECOND, THIRD)
        total = FIRST + SECOND + THIRD
        _wait_sink(spark, query, out, total)
        assert [end for end in _batches_with(query, "m1") if end > back_at], (
            "m1's pair not read after the give-back"
        )
        # Every batch acked in the end: nothing in flight or ready on the active nodes.
        wait_for(lambda: all(_group(n) == (0, 0) for n in (m1, m2)), DEADLINE_S, 0.1)
        assert query.exception() is None
    finally:
        query.stop()
    counts = Counter(_ids(spark, out))
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = [f"id{i}" for i in range(total) if f"id{i}" not in counts]
    print(f"\nstream over m1 (+ slave s1) and m2: produced {total} (first {FIRST}: m1 {on_m1}, m2 {on_m2}; "
          f"{SECOND} after the takeover, {THIRD} after the give-back), "
          f"{sum(counts.values())} rows in the sink, {duplicates} duplicates, {len(missing)} missing; "
          f"{before_kill} rows before the kill -9 of m1, s1 active {taken_s:.1f} s after it, "
          f"the query read m1's pair again {went_on_s:.1f} s after it")  # fmt: skip
    assert duplicates == 0 and not missing and sum(counts.values()) == total


def _group(node: NodeProcess) -> tuple[int, int]:
    stats: dict[str, Any] = get_json(node.url, f"/v1/topics/{TOPIC}", key="test") or {}
    [group] = [g for g in stats.get("groups", []) if g["name"] == "default"] or [
        {"ready": -1, "inflight": -1}
    ]
    return int(group["ready"]), int(group["inflight"])
