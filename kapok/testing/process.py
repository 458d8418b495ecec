"""Start real ``kapok serve`` processes for end-to-end tests.

Each node gets its own working directory and port 0; the helper waits for
the node's "listening on" line (with a deadline) and always stops what it
started, by PID, never by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NodeProcess", "start_node"]

_LISTENING = re.compile(r"listening on (http://\S+)")
_GOSSIP = re.compile(r"gossip on (\S+)")


class NodeProcess:
    """A running node; ``url`` is its HTTP base URL, ``output`` what it printed so far."""

    def __init__(
        self, proc: subprocess.Popen[str], url: str, workdir: Path, lines: list[str], reader: threading.Thread
    ) -> None:
        self.proc = proc
        self.url = url
        self.workdir = workdir
        self._lines = lines
        self._reader = reader

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    @property
    def gossip_addr(self) -> str:
        """The gossip address the node printed (``cluster.enabled`` only)."""
        match = _GOSSIP.search(self.output)
        if match is None:
            raise RuntimeError("this node printed no gossip address (is cluster.enabled set?)")
        return match.group(1)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in ``timeout_s``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the node can tell."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10.0)
        self._reader.join(10.0)


def start_node(
    workdir: Path,
    *sets: str,
    config_text: str | None = None,
    timeout_s: float = 20.0,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] = ("-m", "kapok"),
) -> NodeProcess:
    """Start ``python -m kapok serve`` in ``workdir`` on a free port and wait until it listens.
    ``launcher`` replaces ``-m kapok`` (e.g. with ``kapok.testing.faulty`` and its options)."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, *launcher, "serve", "--set", "server.port=0"]
    if config_text is not None:
        (workdir / "application.yaml").write_text(config_text)
        args += ["-c", str(workdir / "application.yaml")]
    for item in sets:
        args += ["--set", item]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    child_env.update(env or {})
    proc = subprocess.Popen(
        args,
        cwd=workdir,
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.append(line)
                match = _LISTENING.search(line)
                if match and not url:
                    url.append(match.group(1))
                    found.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while not found.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10.0)
            reader.join(10.0)
            raise RuntimeError(f"kapok serve did not start:\n{''.join(lines)[-2000:]}")
    return NodeProcess(proc, url[0], workdir, lines, reader)
