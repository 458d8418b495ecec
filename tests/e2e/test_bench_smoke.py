"""`kapok bench` runs end to end: real nodes, load processes, JSON out. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_bench_publish_and_e2e_both_protocols(tmp_path: Path) -> None:
    args = ["--workload", "publish", "--workload", "e2e", "--messages", "2000"]
    args += ["--protocol", "both", "--fsync", "never", "--json", "--timeout", "90"]
    proc = subprocess.run(
        [sys.executable, "-m", "kapok", "bench", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
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
