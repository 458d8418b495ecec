"""Start and stop real ``kapok serve`` processes: one node, or several as one gossip cluster.

Shipped tooling uses it (``kapok bench``, ``kapok local-cluster``, the gossip measurements
of ``kapok.bench.gossip_real``), and so do the end-to-end tests. Each node gets its own
working directory and port 0; ``start_node`` waits for the node's "listening on" line
(with a deadline); callers stop what they started, by PID, never by name.

Every node runs in a process group of its own (a new session), with what it starts in turn
(its archiver, ``python -m kapok.storage.archiver``): ``kill`` and the last resort of ``stop``
signal the whole group, so no child outlives its node as an orphan. The groups started and not
yet seen empty are kept in a registry (``live_groups``); ``reap_groups`` kills what is left of
them, which is how a test session makes sure a failed or timed-out test leaves nothing running
(``kapok.testing.leakcheck``). Being in a session of its own, a node also gets no Ctrl-C from
a terminal: ``kapok local-cluster`` stops its nodes itself.

``start_cluster`` starts the first node, then the others at once (each in its own thread,
so start-up costs one node's time, not n), all joining through the first node's gossip
address.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "NodeProcess",
    "cluster_sets",
    "get_json",
    "group_members",
    "kill_group",
    "live_groups",
    "nodes_view",
    "reap_groups",
    "spawn_group",
    "start_cluster",
    "start_node",
    "stop_all",
    "wait_for",
]

_LISTENING = re.compile(r"listening on (https?://\S+)")
_GOSSIP = re.compile(r"gossip on (\S+)")

# Process groups started by spawn_group and not yet seen empty: group id → command line.
_groups: dict[int, str] = {}
_groups_lock = threading.Lock()
GROUP_EXIT_S = 5.0  # how long a killed group's members may take to be gone


def spawn_group(
    args: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``args`` as the leader of a new session (so of a process group whose id is its
    PID), output (stdout and stderr) on a text pipe, and register the group: whatever it
    starts stays in the group, and the registry lets ``reap_groups`` find it after a caller
    forgot it or was interrupted before it could stop it."""
    with _groups_lock:  # no reap_groups between the start and the registration
        proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        _groups[proc.pid] = subprocess.list2cmdline(args)
    return proc


def _live_groups() -> dict[int, list[int]]:
    """Every process group with a live (not zombie) process: group id → PIDs, from one walk
    of the process table. Zombies are left out: an orphan is reaped by whoever PID 1 is, and
    in some containers that is never."""
    groups: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE:
                groups.setdefault(os.getpgid(proc.pid), []).append(proc.pid)
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return groups


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in group ``pgid``."""
    return _live_groups().get(pgid, [])


def kill_group(pgid: int, timeout_s: float = GROUP_EXIT_S) -> bool:
    """SIGKILL every process of group ``pgid`` and wait (up to ``timeout_s``) until none is
    left; then the group leaves the registry. True when the group is empty."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        if not group_members(pgid):
            with _groups_lock:
                _groups.pop(pgid, None)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def live_groups() -> dict[int, str]:
    """The registered groups that still have a live process: group id → command line."""
    with _groups_lock:
        registered = dict(_groups)
    alive = _live_groups()
    return {pgid: cmd for pgid, cmd in registered.items() if pgid in alive}


def reap_groups(pgids: Collection[int] | None = None) -> dict[int, str]:
    """Kill what is left of the registered groups (or of those of ``pgids``) and empty the
    registry of them; returns the groups that still had a live process (group id → command
    line): for a caller that meant to stop everything it started, each one is a leak."""
    with _groups_lock:
        chosen = [pgid for pgid in _groups if pgids is None or pgid in pgids]
    left = {pgid: cmd for pgid, cmd in live_groups().items() if pgid in chosen}
    for pgid in left:
        kill_group(pgid)
    with _groups_lock:
        for pgid in chosen:
            _groups.pop(pgid, None)
    return left


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
        """SIGTERM to the node, then SIGKILL to its whole group if it does not exit in
        ``timeout_s``; returns the node's exit code. SIGTERM goes to the node alone: a clean
        stop lets the node wind its archiver down itself. What is left of the group once the
        node is gone (it exited without stopping a child) is killed, not left as an orphan."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        kill_group(self.pid)  # a node that did not stop, and whatever it left of its group
        self.proc.wait(timeout_s)
        self._reader.join(timeout_s)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL to the node and its children: a crash, as far as the node can tell (the
        archiver dies with it rather than finishing on its own)."""
        kill_group(self.pid)
        self.proc.wait(10.0)
        self._reader.join(10.0)


def start_node(
    workdir: Path,
    *sets: str,
    config_text: str | None = None,
    timeout_s: float = 20.0,
    env: Mapping[str, str | None] | None = None,
    launcher: Sequence[str] = ("-m", "kapok"),
    python: str = sys.executable,
) -> NodeProcess:
    """Start ``python -m kapok serve`` in ``workdir`` on a free port and wait until it listens.
    ``launcher`` replaces ``-m kapok`` (e.g. with ``kapok.faulty`` and its options, or a
    ``kapok.pyz``), ``python`` the interpreter."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = [python, *launcher, "serve", "--set", "server.port=0"]
    if config_text is not None:
        (workdir / "application.yaml").write_text(config_text)
        args += ["-c", str(workdir / "application.yaml")]
    for item in sets:
        args += ["--set", item]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    for name, value in (env or {}).items():  # None takes a variable away
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    proc = spawn_group(args, cwd=workdir, env=child_env)
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
            kill_group(proc.pid)
            proc.wait(10.0)
            reader.join(10.0)
            raise RuntimeError(f"kapok serve did not start:\n{''.join(lines)[-2000:]}")
    return NodeProcess(proc, url[0], workdir, lines, reader)


def cluster_sets(profile: str = "fast", seeds: Sequence[str] = ()) -> list[str]:
    """``--set`` items for a gossip node on loopback, port 0."""
    sets = ["cluster.enabled=true", "cluster.bind=127.0.0.1:0", f"cluster.profile={profile}"]
    if seeds:
        sets.append(f"cluster.seeds=[{', '.join(seeds)}]")
    return sets


def start_cluster(
    base: Path,
    count: int,
    *sets: str,
    profile: str = "fast",
    node_sets: Callable[[int], Sequence[str]] = lambda i: (),
    launcher: Callable[[int], Sequence[str]] = lambda i: ("-m", "kapok"),
) -> list[NodeProcess]:
    """``count`` nodes in ``base/node<i>``; node 0 is every other node's seed."""
    first = start_node(base / "node0", *cluster_sets(profile), *sets, *node_sets(0), launcher=launcher(0))
    nodes = [first]
    try:
        seed = first.gossip_addr

        def start(i: int) -> NodeProcess:
            node_args = (*cluster_sets(profile, [seed]), *sets, *node_sets(i))
            return start_node(base / f"node{i}", *node_args, launcher=launcher(i))

        with ThreadPoolExecutor(max_workers=max(1, count - 1)) as pool:
            futures = [pool.submit(start, i) for i in range(1, count)]
        nodes.extend(f.result() for f in futures if f.exception() is None)  # all, to stop them on failure
        for future in futures:
            future.result()  # the first start-up failure, if any
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def stop_all(nodes: Sequence[NodeProcess]) -> None:
    for node in nodes:
        node.stop()


def get_json(node: NodeProcess | str, path: str, timeout_s: float = 2.0, *, key: str | None = None) -> Any:
    """``GET <node URL><path>``, its JSON body; None when the node does not answer. Routes
    such as ``/health`` and ``/cluster/nodes`` need no key; ``/replication/state`` needs
    ``key`` (the node's ``mq.secret_key``, sent as a bearer token)."""
    url = node if isinstance(node, str) else node.url
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url + path, headers=headers), timeout=timeout_s
        ) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def nodes_view(node: NodeProcess, timeout_s: float = 2.0) -> dict[str, dict[str, Any]]:
    """``GET /cluster/nodes`` of one node, by member name; {} when it does not answer."""
    rows: list[dict[str, Any]] = get_json(node, "/cluster/nodes", timeout_s) or []
    return {row["name"]: row for row in rows}


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> float:
    """Poll ``condition`` until true; return the seconds it took. TimeoutError past the deadline."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start
