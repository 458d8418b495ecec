"""`kapok bench` runs end to end: real nodes, load processes, JSON out. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kapok", "bench", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_bench_publish_and_e2e_both_protocols(tmp_path: Path) -> None:
    args = ["--workload", "publish", "--workload", "e2e", "--messages", "2000"]
    args += ["--protocol", "both", "--fsync", "never", "--json", "--timeout", "90"]
    proc = bench(tmp_path, *args)
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
    proc = subprocess.run(
        [sys.executable, "-m", "kapok", "bench", "--workload", "nope"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("kapok: error: unknown workload 'nope'")


def test_soak_smoke_loses_nothing_through_a_kill(tmp_path: Path) -> None:
    """A few seconds of the soak workload: both protocols, reconnects, nacks, kill -9 and
    restart at half time; every confirmed message is delivered (the full run is 10 minutes)."""
    proc = bench(tmp_path, "--workload", "soak", "--minutes", "0.2", "--rate", "500", "--fsync", "never",
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
