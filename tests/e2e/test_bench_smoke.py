"""`kapok bench` runs end to end: real nodes, load processes, JSON out. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kapok.launch import start_node
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CASE_S = f"{scaled(90):g}"  # `kapok bench --timeout`: how long one case may take


def _bench(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kapok", "bench", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        check=False,
    )


def test_bench_publish_and_e2e_both_protocols(tmp_path: Path) -> None:
    args = ["--workload", "publish", "--workload", "e2e", "--messages", "2000"]
    args += ["--protocol", "both", "--fsync", "never", "--json", "--timeout", CASE_S]
    proc = _bench(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    rows = {(r["workload"], r["protocol"]): r for r in doc["rows"]}
    assert set(rows) == {(w, p) for w in ("publish", "e2e") for p in ("native", "kapokmq")}
    for row in rows.values():
        assert row["ok"] is True, row["error"]
        assert row["fsync"] == "never"
        assert row["messages"] == 2000
        assert row["msgs_per_s"] > 0
        assert row["node_cpu_s"] is not None and row["node_rss_bytes"] > 0
    assert doc["options"]["messages"] == 2000


def test_bench_rejects_an_unknown_workload(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--workload", "nope", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kapok: error: unknown workload 'nope'")


def test_bench_roundtrip_and_peer_mode(tmp_path: Path) -> None:
    """The round-trip workload for both protocols, and ``--peer`` with a Kapok node standing in
    for the KapokMQ server (CI has no Go): every case runs against both, in two interleaved
    rounds, and the summary sets medians side by side."""
    peer = start_node(tmp_path / "peer", "storage.fsync=never")
    try:
        args = ["--workload", "roundtrip", "--workload", "e2e", "--messages", "1000", "--seconds", "1"]
        args += ["--protocol", "both", "--fsync", "never", "--rounds", "2", "--json", "--timeout", CASE_S]
        args += ["--peer", f"kapokmq={peer.url}", "--peer-pid", str(peer.pid)]
        proc = _bench(tmp_path, *args)
    finally:
        peer.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    rows = doc["rows"]
    for row in rows:
        assert row["ok"] is True, row["error"]
        assert row["msgs_per_s"] > 0
        assert row["node_rss_bytes"] > 0
    got = sorted((r["round"], r["workload"], r["system"], r["protocol"]) for r in rows)
    want = [
        (n, w, s, p)
        for n in (1, 2)
        for w in ("e2e", "roundtrip")
        for s, p in (("kapok", "native"), ("kapok", "kapokmq"), ("kapokmq", "kapokmq"))
    ]
    assert got == sorted(want)
    # Rounds interleave: the peer's case of a workload follows Kapok's of it, round by round.
    order = [(r["round"], r["workload"], r["system"]) for r in rows]
    assert order.index((1, "e2e", "kapokmq")) < order.index((2, "e2e", "kapok"))
    for row in rows:
        if row["workload"] == "roundtrip":
            assert row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"]
            assert row["messages"] >= 1
    ratios = {(r["workload"], r["kapok"]): r for r in doc["summary"]["ratios"]}
    assert set(ratios) == {
        (w, f"kapok {p} fsync=never") for w in ("e2e", "roundtrip") for p in ("native", "kapokmq")
    }
    for ratio in ratios.values():
        assert ratio["peer"] == "kapokmq"
        assert ratio["msgs_per_s"] > 0
    assert all(
        ratios[("roundtrip", k)]["p99_ms"] > 0
        for k in ("kapok native fsync=never", "kapok kapokmq fsync=never")
    )


def test_soak_smoke_loses_nothing_through_a_kill(tmp_path: Path) -> None:
    """A few seconds of the soak workload: both protocols, reconnects, nacks, kill -9 and
    restart at half time; every confirmed message is delivered (the full run is 10 minutes)."""
    proc = _bench(tmp_path, "--workload", "soak", "--minutes", "0.2", "--rate", "500", "--fsync", "never",
                 "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["workload"] == "soak" and row["ok"] is True, row
    extra = row["extra"]
    assert extra["lost"] == 0 and extra["confirmed"] > 1000
    assert extra["delivered"] >= extra["confirmed"] - extra["lost"]
    assert extra["published"] >= extra["confirmed"]
    assert extra["reconnects"] >= 8  # every client reconnected at least once: the kill
    assert len(extra["rss_mb"]) >= 2 and all(mb > 0 for _, mb in extra["rss_mb"])
    assert "kill -9 of the node" in proc.stderr


def test_scrape_smoke_three_phases_side_by_side(tmp_path: Path) -> None:
    """A short scrape workload: the paced producer alone, then beside scrapers without the key
    and with it; every phase confirmed publishes, the scraper phases have their ratios to the
    first and the node's render count (at most about one a second)."""
    args = ["--workload", "scrape", "--topics", "300", "--seconds", "1", "--fsync", "never", "--json"]
    proc = _bench(tmp_path, *args, "--timeout", CASE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [row["variant"].split(":")[0] for row in rows] == ["A", "B", "C"]
    for row in rows:
        assert row["workload"] == "scrape" and row["ok"] is True, row
        assert row["messages"] > 0 and row["p99_ms"] >= row["p50_ms"] > 0
        assert row["extra"]["topics"] == 300 and row["extra"]["renders"] is not None
    for row in rows[1:]:
        extra = row["extra"]
        assert extra["scrapes"] > 0 and extra["p50_ratio"] > 0 and extra["p99_ratio"] > 0
        assert set(extra["scrape_statuses"]) <= {"200", "429"}, extra
