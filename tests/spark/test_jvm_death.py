"""A Spark JVM that dies mid-run is one error line that says so, for one run and for ``--watch``.

Real processes: ``kapok analytics`` as a child over a synthetic archive, and a kill -9
of its JVM (the child's own ``java`` child, by pid) once the job runs; with ``--watch``
once its first run is done, so the next run meets the dead JVM. Before, the one run
ended with a bare ``[Errno 111] Connection refused``, and ``--watch`` went on: a run
with nothing new calls no JVM. Then a JVM out of memory for real (Spark exits with 52).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from kapok.analytics.bench import write_archive
from kapok.testing.slow import scaled

# spark_runtime: tests/spark/conftest.py (these start the CLI's own session, not the shared one)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600)), pytest.mark.usefixtures("spark_runtime")]

START_S = scaled(300.0)  # Spark's start and, with --watch, a whole first run: on a loaded machine
END_S = scaled(60.0)  # from the kill to the command's own end


class Command:
    """``kapok analytics`` as a child process; its stderr lines as they come."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "kapok", "analytics", *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.tree: list[psutil.Process] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def stderr(self) -> str:
        return "".join(self.lines)

    def jvm(self) -> psutil.Process | None:
        """The JVM: the child's own ``java`` child (Spark's launcher, also java, is a grandchild)."""
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return None
        for child in children:
            try:
                if child.name() == "java":
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def wait_for_jvm(self, line_start: str) -> psutil.Process:
        """The JVM, once it runs and a stderr line starting with ``line_start`` came."""
        deadline = time.monotonic() + START_S
        while True:
            assert self.proc.poll() is None, f"kapok analytics ended first:\n{self.stderr()}"
            if any(line.startswith(line_start) for line in self.lines) and (jvm := self.jvm()):
                return jvm
            assert time.monotonic() < deadline, f"no JVM and {line_start!r} in {START_S} s:\n{self.stderr()}"
            time.sleep(0.1)

    def kill_jvm(self, jvm: psutil.Process) -> None:
        self.tree = self._tree()  # what is left of it, cleaned up by stop()
        jvm.send_signal(signal.SIGKILL)

    def end(self) -> int:
        """Its exit code, once it ended by itself (with all its stderr read)."""
        try:
            code = self.proc.wait(timeout=END_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {END_S} s after its JVM's kill:\n{self.stderr()[-3000:]}")
        self._reader.join(timeout=END_S)
        return code

    def stop(self) -> None:
        """Kill -9 the child and every process that was under it, by pid."""
        left = [*self._tree(), *self.tree]
        if self.proc.poll() is None:
            self.proc.kill()
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()  # psutil checks the pid still names the same process
        self.proc.wait(timeout=END_S)
        self._reader.join(timeout=END_S)
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def _tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


@pytest.mark.parametrize(
    ("events", "watch", "line_start"),
    [
        (20_000, [], "kapok analytics: reading "),  # the job's first step; it runs for seconds more
        (1_000, ["--watch", "0.5"], "kapok analytics: next run in"),  # after the first run
    ],
    ids=["one-run", "watch"],
)
def test_a_dead_jvm_is_one_line_that_says_so_and_names_the_heap_setting(
    tmp_path: Path, events: int, watch: list[str], line_start: str
) -> None:
    store = tmp_path / "store"
    write_archive(store / "archive", events, days=1.0)
    command = Command(
        "--input", str(store), "--output", str(tmp_path / "out"), "--master", "local[2]", *watch
    )
    try:
        command.kill_jvm(command.wait_for_jvm(line_start))
        code = command.end()
    finally:
        command.stop()
    err = command.stderr()
    last = err.splitlines()[-1]
    assert code == 1, err
    assert last.startswith("kapok: error: the Spark JVM died: killed by SIGKILL (signal 9); "), err
    assert "--conf spark.driver.memory=" in last
    assert "Traceback" not in err
    assert "kapok analytics: error:" not in err  # --watch did not go on to another run


# Out of memory for real: a task collects 200,000,000 ids into one list on a 600 MiB heap.
OUT_OF_MEMORY = """
from kapok.analytics.session import build_session, driver_heap, jvm_death, quiet_py4j

quiet_py4j()
session = build_session("local[1]", conf={"spark.driver.memory": "600m"})
heap = driver_heap(session)
try:
    session.range(200_000_000).selectExpr("collect_list(id) AS ids").selectExpr("size(ids)").collect()
except Exception:
    death = jvm_death(session, heap)
    print(death.message if death else "the JVM lives")
"""


def test_a_jvm_out_of_memory_is_named_with_spark_s_exit_status() -> None:
    # Spark stops its context and exits with 52; the failed call returns before the exit.
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_MEMORY], capture_output=True, text=True, timeout=START_S
    )
    assert done.stdout.strip() == (
        "the Spark JVM died: out of memory (exit status 52); "
        "give it a bigger heap than its 600m: --conf spark.driver.memory=2g"
    ), done.stderr[-3000:]
