"""A process tree's memory and CPU, read from Linux's /proc: what the analytics benchmark measures.

``tree_usage`` sums the resident bytes and the CPU seconds of a process and its
descendants; ``jvm_threads`` splits the CPU seconds of the Java processes among them by
what their threads do (the JIT compilers, the garbage collector, Spark's tasks, the rest).
A ``Sampler`` reads both every ``SAMPLE_S`` on a thread of its own while a child runs, and
keeps the peak RSS and the most CPU seconds seen (a lower bound: what the tree spends after
the last sample is missed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Final

__all__ = ["SAMPLE_S", "Sampler", "jvm_threads", "tree_usage"]

SAMPLE_S: Final = 0.1


def _stat(path: str) -> list[str] | None:
    """The fields of a /proc ``stat`` file after the command name (state first), or None
    if its process or thread has exited."""
    try:
        with open(path, encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _tree(root: int) -> dict[int, tuple[int, float]]:
    """``root`` and its descendants: pid → (resident bytes, CPU seconds user + system), from /proc."""
    children: dict[int, list[int]] = {}
    usage: dict[int, tuple[int, float]] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (fields := _stat(f"/proc/{entry}/stat")) is None:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # ppid
        usage[pid] = (int(fields[21]) * page, _cpu_s(fields))  # rss, CPU
    tree: dict[int, tuple[int, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in usage:
            tree[pid] = usage[pid]
        todo.extend(children.get(pid, []))
    return tree


def _sum(tree: dict[int, tuple[int, float]]) -> tuple[int, float]:
    return sum(rss for rss, _ in tree.values()), sum(cpu for _, cpu in tree.values())


def tree_usage(root: int) -> tuple[int, float]:
    """Resident bytes and CPU seconds (user + system) of ``root`` and its descendants, from /proc."""
    return _sum(_tree(root))


# The JVM's threads by what they do, from the start of their names (Linux's 15 characters).
_THREAD_ROLES: Final = (
    ("jit", ("C1 CompilerThre", "C2 CompilerThre")),
    ("gc", ("GC Thread", "G1 ")),
    ("tasks", ("Executor task",)),
)


def jvm_threads(root: int) -> dict[str, float]:
    """CPU seconds of the Java processes under ``root`` per thread role: ``jit`` (the JIT
    compilers, which compile Spark's generated code as it gets hot), ``gc``, ``tasks``
    (Spark's task threads) and ``other`` (query planning, code generation, the rest)."""
    return _jvm_roles(_tree(root))


def _jvm_roles(pids: Iterable[int]) -> dict[str, float]:
    out = dict.fromkeys(("jit", "gc", "tasks", "other"), 0.0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
                if comm.read().strip() != "java":
                    continue
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as comm:
                    name = comm.read().strip()
            except OSError:
                continue
            if (fields := _stat(f"/proc/{pid}/task/{tid}/stat")) is not None:
                role = next((r for r, starts in _THREAD_ROLES if name.startswith(starts)), "other")
                out[role] += _cpu_s(fields)
    return out


class Sampler:
    """The peak RSS and the CPU seconds of a process tree, sampled every ``SAMPLE_S``."""

    def __init__(self, root: int) -> None:
        self.root, self.peak, self.cpu = root, 0, 0.0
        self.jvm = jvm_threads(root)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_S):
            tree = _tree(self.root)  # one walk of /proc a sample, for both
            rss, used = _sum(tree)
            self.peak, self.cpu = max(self.peak, rss), max(self.cpu, used)
            roles = _jvm_roles(tree)
            self.jvm = {role: max(self.jvm[role], roles[role]) for role in roles}

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
