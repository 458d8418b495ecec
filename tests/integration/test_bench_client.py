"""`kapok bench --workload client` runs: the library beside the raw producer. No timing assertions."""

from __future__ import annotations

import json
import socket
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


def test_peer_cmd_starts_a_fresh_peer_for_every_case_and_stops_it(tmp_path: Path) -> None:
    """A Kapok node stands in for KapokMQ (the same protocol): the command runs once per
    case, its PID is the server's (CPU and RSS are read), and nothing is left running."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = (
        f"echo started >> {tmp_path / 'starts'}; exec {sys.executable} -m kapok serve "
        f"--set server.port={port} --set storage.dir={tmp_path / 'peer'} --set mq.secret_key=test"
    )
    args = [
        "--workload",
        "e2e",
        "--protocol",
        "kapokmq",
        "--messages",
        "2000",
        "--fsync",
        "never",
        "--rounds",
        "2",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "kapok", "bench", *args, "--peer", f"kapokmq=http://127.0.0.1:{port}",
         "--peer-cmd", serve, "--rounds", "2", "--json", "--timeout", f"{scaled(90):g}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=scaled(300), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    peer_rows = [r for r in json.loads(proc.stdout)["rows"] if r["system"] == "kapokmq"]
    assert len(peer_rows) == 2 and all(r["ok"] and r["node_rss_bytes"] for r in peer_rows), peer_rows
    assert (tmp_path / "starts").read_text().splitlines() == ["started"] * 2
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # the last peer was stopped
