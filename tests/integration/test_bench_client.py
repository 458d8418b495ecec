"""`kapok bench --workload client` runs: the library beside the raw producer. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kapok.testing.slow import scaled

pytestmark = pytest.mark.slow


def test_bench_client_workload(tmp_path: Path) -> None:
    args = ["--workload", "client", "--messages", "2000", "--inflight", "4", "--fsync", "never"]
    proc = subprocess.run(
        [sys.executable, "-m", "kapok", "bench", *args, "--json", "--timeout", f"{scaled(90):g}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=scaled(300), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [r["variant"] for r in rows] == [
        "raw, 1 in flight", "library, 1 in flight", "raw, 4 in flight", "library, 4 in flight"
    ]  # fmt: skip
    for row in rows:
        assert row["ok"] is True and row["messages"] == 2000 and row["msgs_per_s"] > 0
    assert all(r["extra"]["ratio_to_raw"] > 0 for r in rows if r["variant"].startswith("library"))
