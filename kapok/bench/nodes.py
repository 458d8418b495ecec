"""The node under test: one started by the bench (its own process, a fresh temporary
directory per case) or an existing one reached through ``--url``.

CPU seconds and RSS (``kapok.bench.proc``) are read only when the node's PID is known
and local: a node the bench started, or ``--node-pid`` given with ``--url``. Both include the node's child
processes (its archiver): they are part of what running a node costs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from kapok.bench.proc import cpu_s, rss_bytes
from kapok.launch import NodeProcess, start_node

__all__ = ["LocalNode", "Node", "PeerProcess", "RemoteNode", "wait_health"]

RECOVERED = re.compile(r"recovered (\d+) messages in ([0-9.]+) s")
START_TIMEOUT_S = 120.0  # a restart may replay a long WAL


def wait_health(http_url: str, timeout_s: float) -> bool:
    """Poll ``GET /health`` until it answers 200; False when ``timeout_s`` passes first."""
    return _poll(http_url + "/health", timeout_s, lambda status: status == 200)


def _poll(
    url: str, timeout_s: float, good: Callable[[int], bool], running: Callable[[], bool] = lambda: True
) -> bool:
    """Poll ``GET url`` until its status is ``good``, while ``running``; False when
    ``timeout_s`` passes first (or ``running`` stops being true)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running():
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                if good(resp.status):
                    return True
        except urllib.error.HTTPError as exc:
            if good(exc.code):
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


class PeerProcess(RemoteNode):
    """A peer the bench starts itself (``--peer-cmd``, a shell command that runs it in the
    foreground) and stops after the case: every case meets a fresh peer, not one grown by
    the cases before it. Its PID is the command's: ``exec`` the server so that it is the
    server's, whose CPU and RSS are then read."""

    def __init__(self, http_url: str, command: str, timeout_s: float = 30.0) -> None:
        super().__init__(http_url, None)
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._pid = self.proc.pid
        # Any answer will do: the peer's own routes, not Kapok's /health.
        if not _poll(self.http_url + "/", timeout_s, lambda status: True, lambda: self.proc.poll() is None):
            self.close()
            raise RuntimeError(f"--peer-cmd: no answer at {self.http_url} within {timeout_s:.0f} s")

    def close(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue


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
