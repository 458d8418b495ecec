"""The class cache's rules (kapok.analytics.classcache), with a stand-in for the JVM: a
real process that writes the dump as it exits, as the JVM does, with the exit status given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kapok.analytics import classcache
from kapok.analytics.classcache import ClassCache


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(classcache.CACHE_ENV, raising=False)
    java, jars = tmp_path / "java", tmp_path / "jars"
    java.write_bytes(b"\x7fELF")
    jars.mkdir()
    (jars / "spark-core.jar").write_bytes(b"x" * 10)
    return java, jars


def test_the_cache_is_one_archive_per_java_jars_and_options(
    setup: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    java, jars = setup
    cache = classcache.for_session(str(java), jars, "-XX:TieredStopAtLevel=1", "")
    assert cache is not None and cache.archive.parent == java.parent / "cache" / "kapok"
    same = classcache.for_session(str(java), jars, "-XX:TieredStopAtLevel=1", "-Xmx1g")
    assert same is not None and same.archive == cache.archive
    other_options = classcache.for_session(str(java), jars, "", "")
    (jars / "spark-sql.jar").write_bytes(b"y")
    other_jars = classcache.for_session(str(java), jars, "-XX:TieredStopAtLevel=1", "")
    assert other_options is not None and other_jars is not None
    assert len({cache.archive, other_options.archive, other_jars.archive}) == 3
    # The caller's own CDS options, or the switch, turn it off.
    assert classcache.for_session(str(java), jars, "", "-Xshare:off") is None
    assert classcache.for_session(str(java), jars, "", "-XX:SharedArchiveFile=/x.jsa") is None
    monkeypatch.setenv(classcache.CACHE_ENV, "0")
    assert classcache.for_session(str(java), jars, "", "") is None


def _jvm(dump: Path, status: int) -> Any:
    """A gateway whose process writes ``dump`` at EOF on its stdin, then exits with ``status``."""
    script = f"import sys; sys.stdin.read(); open({str(dump)!r}, 'wb').write(b'cds'); sys.exit({status})"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)

    class Gateway:
        def __init__(self) -> None:
            self.proc = proc

        def shutdown(self) -> None:
            pass

    return Gateway()


def test_a_dump_is_kept_only_after_a_clean_exit(setup: tuple[Path, Path]) -> None:
    java, jars = setup
    cache = classcache.for_session(str(java), jars, "", "")
    assert cache is not None
    options = cache.options()  # no archive yet: this run dumps one
    assert cache.pending == cache.archive.with_name(f"{cache.archive.name}.{os.getpid()}.tmp")
    assert f"-XX:ArchiveClassesAtExit={cache.pending}" in options and "-Xlog:cds*=off" in options
    cache.finish(_jvm(cache.pending, 1))  # died: its dump may be torn (it would crash a JVM)
    assert not cache.archive.exists() and not list(cache.archive.parent.glob("*.tmp"))
    cache.options()
    dump = cache.pending
    assert dump is not None
    cache.finish(_jvm(dump, 0))
    assert cache.archive.read_bytes() == b"cds" and not dump.exists()
    assert cache.options() == f"-XX:SharedArchiveFile={cache.archive} -Xlog:cds*=off -Xlog:class+path*=off"
    assert cache.pending is None  # mapped, nothing to dump


def test_a_session_that_read_no_file_writes_no_dump(setup: tuple[Path, Path]) -> None:
    java, jars = setup
    cache = classcache.for_session(str(java), jars, "", "")
    assert cache is not None
    cache.options()
    dump = cache.pending
    assert dump is not None
    jvm = _jvm(dump, 0)
    cache.finish(jvm, keep=False)  # killed: it never gets to write the dump
    assert jvm.proc.returncode == -9
    assert not dump.exists() and not cache.archive.exists() and cache.pending is None
    cache.options()  # the next run dumps again
    assert cache.pending is not None


def test_leftovers_of_gone_processes_and_other_keys_are_removed(setup: tuple[Path, Path]) -> None:
    java, jars = setup
    cache = classcache.for_session(str(java), jars, "", "")
    assert cache is not None
    base = cache.archive.parent
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = base / f"{cache.archive.name}.{int(gone.stdout)}.tmp"  # a run killed before its finish
    live = base / f"spark-classes-0000000000000000.jsa.{os.getpid()}.tmp"  # another key's, still running
    old = base / "spark-classes-1111111111111111.jsa"  # another JDK's
    for path in (stale, live, old):
        path.write_bytes(b"x")
    ClassCache(cache.archive).options()
    assert not stale.exists() and not old.exists() and live.exists()
