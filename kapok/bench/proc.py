"""CPU and memory of processes, for the benchmarks (psutil; None where it cannot tell)."""

from __future__ import annotations

import resource
import sys

import psutil

__all__ = ["cpu_s", "peak_rss_bytes", "rss_bytes"]


def _tree(pid: int | None, children: bool = True) -> list[psutil.Process]:
    """``pid`` (None: this process) and its running descendants (a node and its archiver);
    [] when ``pid`` is gone."""
    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)] if children else [proc]
    except psutil.Error:
        return []


def cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of ``pid`` and its descendants."""
    total, seen = 0.0, False
    for proc in _tree(pid) if pid is not None else ():
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # a child that exited meanwhile
        total += times.user + times.system
        seen = True
    return total if seen else None


def rss_bytes(pid: int | None = None, *, children: bool = True) -> int | None:
    """Resident set size of ``pid`` (default: this process) and, unless told otherwise,
    its descendants."""
    total, seen = 0, False
    for proc in _tree(pid, children):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
        seen = True
    return total if seen else None


def peak_rss_bytes() -> int:
    """This process's peak resident set size."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB elsewhere
