"""The node under test: one started by the bench (its own process, a fresh temporary
directory per case) or an existing one reached through ``--url``.

CPU seconds and RSS (``kapok.bench.proc``) are read only when the node's PID is known
and local: a node the bench started, or ``--node-pid`` given with ``--url``. Both include the node's child
processes (its archiver): they are part of what running a node costs.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from kapok.bench.proc import cpu_s, rss_bytes
from kapok.launch import NodeProcess, start_node

__all__ = ["LocalNode", "Node", "RemoteNode", "wait_health"]

RECOVERED = re.compile(r"recovered (\d+) messages in ([0-9.]+) s")
START_TIMEOUT_S = 120.0  # a restart may replay a long WAL


def wait_health(http_url: str, timeout_s: float) -> bool:
    """Poll ``GET /health`` until it answers 200; False when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(http_url + "/health", timeout=2.0) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.01)
    return False


class Node:
    """What a workload needs from the node under test."""

    http_url: str
    local: bool
    fsync: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.http_url.removeprefix("http")

    @property
    def pid(self) -> int | None:
        return None

    def cpu_s(self) -> float | None:
        return cpu_s(self.pid)

    def rss_bytes(self) -> int | None:
        return rss_bytes(self.pid)

    def close(self) -> None:
        return None


class RemoteNode(Node):
    def __init__(self, http_url: str, pid: int | None) -> None:
        self.http_url = http_url.rstrip("/")
        self.local = False
        self.fsync = "-"
        self._pid = pid

    @property
    def pid(self) -> int | None:
        return self._pid


class LocalNode(Node):
    """``kapok serve`` on port 0 in a fresh temporary directory, removed on ``close``."""

    def __init__(self, fsync: str, sets: Sequence[str]) -> None:
        self.local = True
        self.fsync = fsync
        self.workdir = Path(tempfile.mkdtemp(prefix="kapok-bench-"))
        self.storage = self.workdir / "data"
        self.sets = [f"storage.dir={self.storage}", f"storage.fsync={fsync}", *sets]
        self.proc: NodeProcess | None = None
        self.http_url = ""
        try:
            self.first_start_s = self.start()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.alive() else None

    def start(self) -> float:
        """Start (or restart) the node; returns the seconds until ``/health`` answered."""
        t0 = time.monotonic()
        self.proc = start_node(self.workdir, *self.sets, timeout_s=START_TIMEOUT_S)
        self.http_url = self.proc.url
        if not wait_health(self.http_url, START_TIMEOUT_S):
            raise RuntimeError("the node did not answer /health")
        return time.monotonic() - t0

    def recovered(self) -> tuple[int, float] | None:
        """(messages, seconds) from this run's start-up log line, if it printed one."""
        match = RECOVERED.search(self.proc.output) if self.proc is not None else None
        return (int(match.group(1)), float(match.group(2))) if match else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def disk_bytes(self, subdir: str) -> int:
        """Bytes in one folder of the storage directory (``wal``, ``snapshots``, ``archive``)."""
        return sum(p.stat().st_size for p in (self.storage / subdir).rglob("*") if p.is_file())

    def close(self) -> None:
        try:
            if self.proc is not None:
                self.proc.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
