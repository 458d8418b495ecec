"""Analytics over every node's archive through a failover (issue 26, acceptance 1).

Real processes: master ``a`` with its slave ``a2`` (async mode, so the slave takes
publishes while it leads) and a second master ``b``. A mixed workload on three topics,
spread over both masters: publishes, acks, nacks and their redeliveries, and leases
still open when ``a``'s process gets SIGKILL; ``a2`` takes over (its takeover requeues them) and
serves more of the workload; ``a`` comes back and takes its role back (give-back); more
workload; every node is stopped cleanly, so its archiver writes everything out.

Then ``kapok analytics`` over the three archives (and over ``a``'s archive twice more:
the same directory and a glob inside it) must equal an independent recount in plain
Python of the archive lines: every line read, each event once (by its ``run``, ``lsn``
and ``ev``), counted per topic and kind; and the workload's own ground truth (the codes
the masters accepted, the acks the consumer sent). The old job counts every line it
reads (an archive given twice counts twice), and the README's advice (the masters'
archives only) misses the slave's active period: both are checked on the archives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kapok.launch import NodeProcess, cluster_sets, get_json, group_members, start_node, stop_all, wait_for
from kapok.storage.archive import list_archive_files, read_archive_file
from kapok.storage.events import Event
from kapok.testing.pair import start_pair
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(scaled(600))]

HEADERS = {"Authorization": "Bearer test", "Content-Type": "application/json"}
TIMEOUT_S = 1.0  # replication.failover_timeout_s of the pair
DEADLINE_S = scaled(30.0)
TOPICS = ("orders", "events", "audit")
KINDS = ("published", "delivered", "acked", "retried", "dead_lettered", "expired")


def _call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=HEADERS, method=method)
    with urllib.request.urlopen(request, timeout=scaled(10.0)) as resp:
        return json.loads(resp.read())


class Workload:
    """Publishes and consumes through the HTTP API, remembering what the nodes confirmed."""

    def __init__(self) -> None:
        self.published: dict[str, set[str]] = {t: set() for t in TOPICS}
        self.acked: Counter[str] = Counter()
        self.n = 0

    def publish(self, url: str, topic: str, count: int) -> list[str]:
        messages = [{"data": f"{topic} {self.n + i}"} for i in range(count)]
        self.n += count
        codes = _call(url, "POST", f"/v1/topics/{topic}/messages", {"messages": messages})["codes"]
        assert len(codes) == count
        self.published[topic].update(codes)
        return list(codes)

    def lease(self, url: str, topic: str, n: int, lease_s: float = 600.0) -> list[str]:
        answer = _call(url, "GET", f"/v1/topics/{topic}/messages?max={n}&lease_s={lease_s}")
        return [m["code"] for m in answer["messages"]]

    def ack(self, url: str, topic: str, codes: list[str]) -> None:
        if codes:
            _call(url, "POST", f"/v1/topics/{topic}/ack", {"group": "default", "codes": codes})
            self.acked[topic] += len(codes)

    def nack(self, url: str, topic: str, codes: list[str]) -> None:
        _call(url, "POST", f"/v1/topics/{topic}/nack", {"group": "default", "codes": codes})

    def drain(self, url: str, topic: str) -> None:
        while codes := self.lease(url, topic, 100):
            self.ack(url, topic, codes)

    def round(self, urls: list[str], per_topic: int) -> None:
        """Publish to every topic on every master; ack most, nack some (delivered again)."""
        for url in urls:
            for topic in TOPICS:
                self.publish(url, topic, per_topic)
            first = self.lease(url, "events", per_topic // 2)
            self.nack(url, "events", first[: len(first) // 2])
            self.ack(url, "events", first[len(first) // 2 :])
            for topic in TOPICS:
                self.drain(url, topic)


def _fed(url: str) -> float | None:
    """The node's archive bytes fed so far (``/metrics``), None if it does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=scaled(5.0)) as resp:
            for line in resp.read().decode().splitlines():
                if "archive_bytes_fed_total" in line and not line.startswith("#"):
                    return float(line.split()[-1])
    except OSError:
        return None
    return 0.0


def _archive_settled(url: str) -> None:
    """Wait until the node has handed the archiver every frame written so far: the count
    fed stays the same over two reads (the WAL hands frames over every 25 ms at most)."""
    seen: list[float | None] = []

    def steady() -> bool:
        seen.append(_fed(url))
        return len(seen) > 5 and seen[-1] is not None and seen[-1] == seen[-5]

    wait_for(steady, DEADLINE_S, 0.05)


def _active(url: str) -> bool:
    return bool((get_json(url, "/health") or {}).get("active"))


def _archive(workdir: Path) -> list[Event]:
    directory = workdir / "data" / "archive"
    if not directory.exists():
        return []
    return [e for f in list_archive_files(directory) for e in read_archive_file(f.path)]


def _recount(events: list[Event]) -> dict[str, Counter[str]]:
    """Per topic, the count of each kind, each event once: the test's own reading."""
    seen: set[tuple[Any, ...]] = set()
    counts: dict[str, Counter[str]] = {}
    for e in events:
        key = (e["run"], e["lsn"], e["ev"])
        if key in seen:
            continue
        seen.add(key)
        counts.setdefault(e["topic"], Counter())[e["ev"]] += 1
    return counts


def _analytics(output: Path, *inputs: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "kapok", "analytics", "--output", str(output)]
    for path in inputs:
        args += ["--input", path]
    done = subprocess.run(args, capture_output=True, text=True, timeout=scaled(600))
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    return summary


def test_every_node_s_archive_counts_each_event_once_through_takeover_and_give_back(tmp_path: Path) -> None:
    work = Workload()
    a, a2 = start_pair(tmp_path, mode="async", profile="fast", failover_timeout_s=TIMEOUT_S)
    nodes = [a, a2]
    try:
        b = start_node(tmp_path / "b", *cluster_sets("fast", [a.gossip_addr]), "server.name=b")
        nodes.append(b)
        work.round([a.url, b.url], 30)
        # Leased on the master and never acked: the takeover delivers them again.
        for topic in TOPICS:
            work.publish(a.url, topic, 10)
        open_leases = {topic: work.lease(a.url, topic, 5) for topic in TOPICS}
        assert all(len(codes) == 5 for codes in open_leases.values())
        _archive_settled(a.url)
        port, gossip = a.url.rsplit(":", 1)[1], a.gossip_addr
        # SIGKILL to the node alone, as a crash of its process: its archiver reads to the end
        # of the pipe and writes out what it was given (a kill of the whole group, as of the
        # machine, would lose the archiver's buffer too: an accepted loss, not tested here).
        os.kill(a.pid, signal.SIGKILL)
        wait_for(lambda: group_members(a.pid) == [], DEADLINE_S, 0.05)
        a.kill()  # reaps it
        wait_for(lambda: _active(a2.url), DEADLINE_S, 0.05)

        work.round([a2.url, b.url], 20)  # the takeover period: a2 leads
        back: NodeProcess = start_node(
            a.workdir,
            *cluster_sets("fast", [gossip]),
            "server.name=master",
            f"server.port={port}",
            f"cluster.bind={gossip}",
            "replication.mode=async",
            f"replication.failover_timeout_s={TIMEOUT_S}",
        )
        nodes.append(back)
        wait_for(lambda: _active(back.url), DEADLINE_S, 0.05)
        wait_for(lambda: (get_json(a2.url, "/health") or {}).get("role") == "slave", DEADLINE_S, 0.05)
        work.round([back.url, b.url], 20)  # after the give-back
        for node in (a2, back, b):  # the slave first: a master stopped first would hand over
            assert node.stop(timeout_s=scaled(30.0)) == 0
    finally:
        stop_all(nodes)

    dirs = {name: tmp_path / name for name in ("master", "slave", "b")}
    archives = {name: _archive(path) for name, path in dirs.items()}
    every = [e for events in archives.values() for e in events]
    assert all("run" in e and "lsn" in e for e in every)
    print({name: len(events) for name, events in archives.items()}, "archive lines per node")

    # The overlaps found: no event is in two nodes' archives, not even by its content.
    def content(e: Event) -> tuple[Any, ...]:
        return (e["ev"], e.get("code"), e.get("group"), e.get("attempt"), e.get("t"))

    assert len({content(e) for e in every}) == len(every)

    truth = _recount(every)
    assert truth == _recount(archives["master"] + archives["b"] + archives["slave"] + archives["master"])
    # The slave's archive holds its active period only: published, takeover requeues, acks.
    slave_kinds = Counter(e["ev"] for e in archives["slave"])
    assert slave_kinds["published"] >= 3 * 20 and slave_kinds["retried"] >= 3 * 5, slave_kinds
    takeover = [e for e in archives["slave"] if e["ev"] == "retried" and e.get("reason") == "takeover"]
    assert sorted(e["code"] for e in takeover) == sorted(c for codes in open_leases.values() for c in codes)

    # Ground truth from the workload: every accepted code published once, every ack sent.
    for topic in TOPICS:
        assert truth[topic]["published"] == len(work.published[topic]), topic
        assert truth[topic]["acked"] == work.acked[topic], topic

    storage = {name: path / "data" for name, path in dirs.items()}  # each node's storage.dir
    summary = _analytics(
        tmp_path / "out",
        str(storage["master"]),
        str(storage["slave"]),
        str(storage["b"]),
        str(storage["master"]),  # the same archive again,
        str(storage["master"] / "archive" / "archive-*.jsonl"),  # and once more by a glob
    )
    got = {topic: {kind: figures[kind] for kind in KINDS} for topic, figures in summary["topics"].items()}
    want = {topic: {kind: truth[topic][kind] for kind in KINDS} for topic in truth}
    assert got == want
    days = Counter[tuple[str, str]]()
    for row in summary["days"]:
        for kind in KINDS:
            days[row["topic"], kind] += row[kind]
    assert days == Counter(
        {(t, k): n for t, counts in truth.items() for k, n in counts.items() if k in KINDS}
    )

    # What the README's old advice gives: the masters' archives only miss the slave's period.
    masters_only = _recount(archives["master"] + archives["b"])
    assert any(masters_only.get(t, Counter())["published"] < truth[t]["published"] for t in TOPICS)
