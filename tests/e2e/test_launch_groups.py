"""Nodes started by ``kapok.launch`` leave nothing behind: each runs in a process group of its
own with its archiver child, ``kill`` and ``stop`` end the whole group, and the test session's
last step (``kapok.testing.leakcheck``) kills and reports any group a test left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from kapok import launch
from kapok.launch import NodeProcess, kill_group, live_groups, reap_groups, spawn_group, start_node, wait_for
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _gone(pid: int) -> bool:
    """No such process, or only a zombie that nobody reaped (what PID 1 is, varies)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _archivers(node: NodeProcess) -> list[psutil.Process]:
    children = psutil.Process(node.pid).children()
    return [c for c in children if "kapok.storage.archiver" in " ".join(c.cmdline())]


def _archiver(node: NodeProcess) -> psutil.Process:
    wait_for(lambda: bool(_archivers(node)), timeout_s=scaled(10.0))
    [child] = _archivers(node)
    return child


def test_kill_ends_the_node_and_its_archiver(tmp_path: Path) -> None:
    node = start_node(tmp_path / "node")
    try:
        assert os.getpgid(node.pid) == node.pid  # a group of its own, led by the node
        archiver = _archiver(node)
        assert os.getpgid(archiver.pid) == node.pid
        assert node.pid in live_groups()
    finally:
        node.kill()
    assert _gone(node.pid)
    assert _gone(archiver.pid)  # not an orphan of PID 1, still writing the archive
    assert node.pid not in live_groups()
    assert node.pid not in launch._groups  # the registry forgets a group once it is empty


def test_stop_ends_the_node_and_its_archiver(tmp_path: Path) -> None:
    node = start_node(tmp_path / "node")
    try:
        archiver = _archiver(node)
    finally:
        code = node.stop()
    assert code == 0
    assert _gone(node.pid) and _gone(archiver.pid)
    assert node.pid not in launch._groups


def test_a_stop_signal_during_start_up_lets_it_finish_and_stops_cleanly(tmp_path: Path) -> None:
    # The SIGTERM lands while the node recovers its store, before it listens. Python's
    # default action used to end the node on the spot (exit -15, no shutdown snapshot), and
    # a stop just after the "listening" line could meet the same gap (CI saw it, loaded).
    args = [sys.executable, "-m", "kapok", "serve", "--set", "server.port=0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    proc = spawn_group(args, cwd=tmp_path, env=env)
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        for line in proc.stdout:  # ends at EOF, if the node dies first
            lines.append(line)
            if "kapok.storage: recovered" in line:
                proc.send_signal(signal.SIGTERM)
                break
        lines += proc.stdout.read().splitlines(keepends=True)  # to EOF: the node's exit
        out = "".join(lines)
        assert proc.wait(scaled(20.0)) == 0, out
        assert "SIGTERM received: shutting down" in out, out
        assert "archiver finished (exit code 0" in out and "stopped cleanly" in out, out
    finally:
        kill_group(proc.pid)
        proc.wait(scaled(10.0))
        proc.stdout.close()


def test_reap_groups_kills_and_reports_what_was_left_running() -> None:
    sleeper = spawn_group(["sleep", "60"])
    try:
        assert live_groups().get(sleeper.pid) == "sleep 60"
        assert reap_groups([sleeper.pid]) == {sleeper.pid: "sleep 60"}
        assert sleeper.wait(scaled(5.0)) == -9
        assert reap_groups([sleeper.pid]) == {}  # reported once: it is no longer registered
        assert sleeper.pid not in launch._groups
    finally:
        sleeper.kill()
        sleeper.wait(scaled(5.0))
        assert sleeper.stdout is not None
        sleeper.stdout.close()


def test_reap_groups_kills_the_children_of_a_leader_that_exited() -> None:
    # A leader that died on its own (a crashed node) may leave its children running.
    script = "import subprocess; print(subprocess.Popen(['sleep', '60']).pid)"
    leader = spawn_group([sys.executable, "-c", script])
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    leader.wait(scaled(10.0))
    leader.stdout.close()
    assert not _gone(child) and os.getpgid(child) == leader.pid
    assert leader.pid in reap_groups([leader.pid])
    wait_for(lambda: _gone(child), timeout_s=scaled(5.0))


INNER_TEST = """
    from pathlib import Path

    from kapok.launch import spawn_group


    def test_forgets_to_stop_what_it_started() -> None:
        proc = spawn_group(["sleep", "60"])
        Path("sleeper.pid").write_text(str(proc.pid))
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_a_session_that_leaves_a_process_running_fails_and_kills_it(tmp_path: Path, xdist: bool) -> None:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TEST))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KAPOK_"))}
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "kapok.testing.leakcheck", "-q"]
    if xdist:
        args += ["-n", "1"]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(60))
    out = run.stdout + run.stderr
    pid = int((tmp_path / "sleeper.pid").read_text())
    assert "1 passed" in out, out  # the test itself passed ...
    assert run.returncode == 1, out  # ... and the run fails all the same
    assert "still running; killed them" in out and "sleep 60" in out, out
    assert _gone(pid)
