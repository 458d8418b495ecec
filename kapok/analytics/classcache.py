"""A cache of the classes a local session's JVM loads: a dynamic CDS archive (AppCDS).

A local run's JVM loads and verifies some 10,000 classes of Spark, Hadoop, Arrow and
Parquet; on two cores that is the larger part of its fixed cost. The JDK can dump the
classes one run loaded when its JVM exits (``-XX:ArchiveClassesAtExit``) and map them,
already parsed and verified, into later JVMs (``-XX:SharedArchiveFile``). Measured here
(docs/benchmarks.md): an empty run 7.8 → 4.5 CPU-seconds, 1,000,000 events 19.3 → 14.1.

The rules:

* Only for ``kapok analytics``' own local session, unless ``KAPOK_SPARK_CLASS_CACHE=0``
  or the caller's own JVM options already name a CDS option (``-Xshare``,
  ``SharedArchiveFile``, ``ArchiveClasses…``).
* The archive is ``spark-classes-<key>.jsa`` in ``$XDG_CACHE_HOME/kapok`` (else
  ``~/.cache/kapok``); ``<key>`` hashes what it must match: the java binary (its path,
  size and mtime), Spark's jars (their folder, names and sizes: the class path), the
  JVM options this module's caller always sets, and ``_RULES`` (the rules it was kept
  under, below). Another JDK or Spark gets another key;
  the JVM itself refuses an archive that does not match (it then runs as without one).
* Without an archive, the run dumps one to ``<archive>.<pid>.tmp``, and ``finish`` — after
  the session's stop — closes the gateway, waits for the JVM's exit (the dump is written
  then) and moves the dump into place only if the JVM exited 0: a torn archive (a JVM
  killed mid-dump, a full disk) crashes the JVM that maps it (SIGBUS). Dumps of processes
  that are gone, and archives of other keys, are removed. A session that is not finished
  (a test's) leaves its dump to be removed by a later run.
* Only a run that read files keeps its dump: one that read none (an empty archive,
  nothing new) never loaded the classes that read, shuffle and write rows, and a run
  over 1,000,000 events that maps its archive costs about 1.4 CPU-seconds more than one
  that maps a dump of a run with events (docs/benchmarks.md). Its JVM is killed once
  Spark has stopped, so it spends no time on a dump; a later run dumps again.
* The JVM's CDS log is off: a dump lists the classes it skips, a mismatch says so, and
  neither concerns the user.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any, Final

import psutil

__all__ = ["CACHE_ENV", "EXIT_WAIT_S", "ClassCache", "for_session"]

CACHE_ENV: Final = "KAPOK_SPARK_CLASS_CACHE"
_CDS_OPTIONS: Final = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "DumpLoadedClassList")
_QUIET: Final = "-Xlog:cds*=off -Xlog:class+path*=off"
# In the key: archives kept under earlier rules (a dump of a run that read no file) are replaced.
_RULES: Final = 2
EXIT_WAIT_S: Final = 120.0  # the JVM writes the dump (about 200 MB) as it exits


class ClassCache:
    """The archive of one key: what the JVM options say, and what ``finish`` does."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self.pending: Path | None = None  # this process's dump, until ``finish``

    def options(self) -> str:
        """The JVM options: map the archive, else dump one (and clear what was left before)."""
        self._tidy()
        if self.archive.is_file():
            return f"-XX:SharedArchiveFile={self.archive} {_QUIET}"
        self.pending = self.archive.with_name(f"{self.archive.name}.{os.getpid()}.tmp")
        return f"-XX:ArchiveClassesAtExit={self.pending} {_QUIET}"

    def finish(self, gateway: Any, *, keep: bool = True) -> None:
        """After the session's stop: end the JVM (EOF on its stdin ends Spark's gateway
        server), wait for it, and keep the dump if it exited 0. Without ``keep`` (the
        session read no file) the JVM is killed instead, so it writes no dump at all."""
        pending, self.pending = self.pending, None
        proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
        if pending is None or proc is None:
            return
        if not keep:
            proc.kill()  # before it can exit and dump: Spark has stopped, nothing else is in it
        with contextlib.suppress(Exception):
            gateway.shutdown()
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            status = proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            status = None
        with contextlib.suppress(OSError):
            if status == 0 and pending.is_file() and pending.stat().st_size > 0:
                os.replace(pending, self.archive)
            else:
                pending.unlink(missing_ok=True)

    def _tidy(self) -> None:
        """Remove dumps of processes that are gone and archives of other keys."""
        with contextlib.suppress(OSError):
            for path in self.archive.parent.glob("spark-classes-*"):
                if path == self.archive:
                    continue
                pid = path.stem.rpartition(".")[2] if path.suffix == ".tmp" else ""
                if not (pid.isdigit() and psutil.pid_exists(int(pid))):
                    path.unlink(missing_ok=True)


def for_session(java: str, jars: Path, fixed_options: str, caller_options: str) -> ClassCache | None:
    """The class cache of a local session, or None where it does not apply (see above)."""
    if os.environ.get(CACHE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if any(option in caller_options for option in _CDS_OPTIONS):
        return None
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kapok"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if not os.access(base, os.W_OK):
            return None
        binary = Path(java).resolve()
        stat = binary.stat()
        digest = hashlib.sha256(
            f"{_RULES}\0{binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0{fixed_options}\0{jars.resolve()}".encode()
        )
        for jar in sorted(jars.glob("*.jar")):
            digest.update(f"\0{jar.name}\0{jar.stat().st_size}".encode())
    except OSError:
        return None
    return ClassCache(base / f"spark-classes-{digest.hexdigest()[:16]}.jsa")
