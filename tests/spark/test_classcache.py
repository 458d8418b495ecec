"""The class cache with a real JVM: ``kapok analytics`` dumps it once, and the next run maps it.

Runs of the command as a child process, with a cache folder of their own: one over an
empty archive leaves no archive; the first that reads files leaves one (and no dump in
progress); the next one's JVM has that archive mapped (its /proc maps name the file) and
leaves it as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kapok.analytics import classcache
from kapok.analytics.bench import write_archive
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600)), pytest.mark.usefixtures("spark_runtime")]


def _run(store: Path, output: Path, env: dict[str, str]) -> tuple[int, str, bool]:
    """One run: its exit code, its stderr, and whether its JVM mapped a class archive."""
    command = [sys.executable, "-m", "kapok", "analytics", "--input", str(store), "--output", str(output)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    mapped = False
    deadline = time.monotonic() + scaled(300.0)
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                if child.name() == "java" and not mapped:
                    mapped = any(
                        m.path.endswith(".jsa") and "spark-classes-" in m.path for m in child.memory_maps()
                    )
        except psutil.Error:
            pass
        time.sleep(0.2)
    try:
        _, err = proc.communicate(timeout=scaled(120.0))
    finally:
        proc.kill()
    return proc.returncode, err, mapped


def test_the_first_run_dumps_the_class_cache_and_the_next_maps_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_archive(store / "archive", 2_000, days=1.0)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop(classcache.CACHE_ENV, None)
    cache = tmp_path / "cache" / "kapok"

    # A run that reads no file keeps no dump: it lacks the classes that read and write rows.
    (tmp_path / "empty" / "archive").mkdir(parents=True)
    code, err, mapped = _run(tmp_path / "empty", tmp_path / "out0", env)
    assert code == 0, err
    assert not mapped and list(cache.iterdir()) == []

    code, err, mapped = _run(store, tmp_path / "out1", env)
    assert code == 0, err
    assert not mapped  # nothing to map yet
    [archive] = cache.iterdir()  # the dump, in place: no ``.tmp`` left
    assert archive.name.startswith("spark-classes-") and archive.suffix == ".jsa"
    assert archive.stat().st_size > 1_000_000
    stamp = archive.stat().st_mtime_ns

    code, err, mapped = _run(store, tmp_path / "out2", env)
    assert code == 0, err
    assert mapped
    assert list(cache.iterdir()) == [archive] and archive.stat().st_mtime_ns == stamp
    assert "cds" not in err.lower()  # the JVM's CDS log is off
    first, second = (json.loads((tmp_path / out / "summary.json").read_text()) for out in ("out1", "out2"))
    assert {**first, "generated_at": None} == {**second, "generated_at": None}  # the same figures
