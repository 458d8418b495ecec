"""``kapok local-cluster``: real nodes from generated files, stopped cleanly by a signal."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from kapok.cluster.show import fetch_nodes
from kapok.launch import wait_for
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LINE = re.compile(r"^\s+(\S+)\s+(master|slave of \S+)\s+(http://\S+)\s+gossip (\S+)\s+pid (\d+)\s+(\S+)$")


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_local_cluster_with_slaves_starts_from_its_files_and_stops(tmp_path: Path, stop_signal: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kapok", "local-cluster", "--masters", "2", "--slaves",
         "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout
    assert stdout is not None

    def pump() -> None:
        with stdout:
            for line in stdout:
                lines.put(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    rows = []
    try:
        deadline = time.monotonic() + scaled(60)
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if (match := LINE.match(line)) is not None:
                rows.append(match.groups())
            if line.startswith("Ctrl-C stops"):
                break
        assert [r[0] for r in rows] == ["m1", "m2", "s1", "s2"]
        assert [r[1] for r in rows] == ["master", "master", "slave of m1", "slave of m2"]
        urls = {r[0]: r[2] for r in rows}
        for name, role, url, gossip, _pid, path in rows:
            config = yaml.safe_load(Path(path).read_text())
            assert Path(path) == tmp_path / name / "application.yaml"
            assert f"http://127.0.0.1:{config['server']['port']}" == url
            assert config["cluster"]["bind"] == gossip and config["cluster"]["profile"] == "fast"
            if role.startswith("slave"):
                assert config["replication"] == {"role": "slave", "master": urls[role.split()[-1]]}
        # Every member's view shows the pairs the files describe: what the client groups by.
        expected = {
            "m1": ("master", True, "s1"), "m2": ("master", True, "s2"),
            "s1": ("slave", False, "m1"), "s2": ("slave", False, "m2"),
        }  # fmt: skip

        def pairs(url: str) -> dict[str, tuple[str, bool, str]]:
            return {r["name"]: (r["role"], r["active"], r["pair"]) for r in fetch_nodes(url)}

        wait_for(lambda: all(pairs(url) == expected for url in urls.values()), scaled(30), 0.1)
        proc.send_signal(stop_signal)
        assert proc.wait(scaled(30)) == 0
    finally:
        if proc.poll() is None:  # a failed test: stop the command, then any node it left, by PID
            proc.kill()
            proc.wait(scaled(10))
            for row in rows:
                if not _pid_gone(int(row[4])):
                    os.kill(int(row[4]), signal.SIGKILL)
    reader.join(scaled(10))
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert "kapok local-cluster: stopped\n" in rest
    pids = [int(r[4]) for r in rows]
    wait_for(lambda: all(_pid_gone(pid) for pid in pids), scaled(10))
