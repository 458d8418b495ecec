"""The SparkSession of ``kapok analytics``: checks first, then local defaults that matter.

Spark needs Java (17 or 21 for Spark 4) and, for Python data sources, pyarrow; both are
checked before the JVM starts so that their absence is one clear line, not a page of
Java. On a ``local[…]`` master the driver binds to loopback (else Spark binds the
machine's outward interface), the UI stays off, Python workers run this interpreter
(so they import the same kapok and pyarrow), shuffles use a few partitions instead
of 200, and the heap is a quarter of the machine's memory (1 to 8 GiB), not 1 GiB.
Every session computes in UTC and writes Parquet timestamps as INT64 microseconds
(UTC-adjusted).

A JVM that dies mid-run (out of memory, killed) fails every later call with a bare
"Connection refused": ``jvm_death`` tells that case apart and says how it died.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from kapok.analytics import classcache
from kapok.errors import AnalyticsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "build_session",
    "death_message",
    "driver_heap",
    "java_executable",
    "jvm_death",
    "quiet_py4j",
    "require_runtime",
    "stop_session",
]

APP_NAME: Final = "kapok analytics"
LOG_CONFIG: Final = Path(__file__).with_name("log4j2.properties")
INSTALL_HINT: Final = "pip install 'kapok[analytics]'"
JAVA_HINT: Final = (
    "install a Java runtime 17 or 21 (Debian: apt-get install default-jre-headless) or set JAVA_HOME"
)
OOM_STATUS: Final = 52  # Spark's exit status for an OutOfMemoryError (SparkExitCode.OOM)
STOP_SIGNALS: Final = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM})
_CLASS_CACHE: classcache.ClassCache | None = None  # the local session's (one per process)
REAP_WAIT_S: Final = 15.0  # a JVM that stopped answering or stopped Spark is exiting: its status comes soon


def java_executable() -> str | None:
    """The ``java`` Spark will start: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def require_runtime() -> None:
    """``AnalyticsError`` unless PySpark, pyarrow and Java are there."""
    missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:
        raise AnalyticsError(f"{' and '.join(missing)} not installed: {INSTALL_HINT}")
    if java_executable() is None:
        where = "JAVA_HOME has no bin/java" if os.environ.get("JAVA_HOME") else "no java on PATH"
        raise AnalyticsError(f"Spark needs Java, and there is none ({where}): {JAVA_HINT}")


# The JIT's first tier only: the job's per-event work runs in Python (kapok.analytics.engine),
# so the JVM runs little code often enough to repay C2's optimizing compiles, which cost
# 20-30 CPU-seconds a run (docs/benchmarks.md). A caller's own options come after, and win.
LOCAL_JVM_OPTIONS: Final = "-XX:TieredStopAtLevel=1"


def local_conf(master: str | None) -> dict[str, str]:
    """The settings of a ``local[…]`` session (none for a cluster's master)."""
    if master is None or not master.startswith("local"):
        return {}
    cores = os.cpu_count() or 2
    return {
        # Spark's default heap (1 GiB) ran out at 5,000,000 archived events; local mode
        # has one JVM, so it gets a quarter of the machine, 1 to 8 GiB.
        "spark.driver.memory": f"{_heap_mib()}m",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        "spark.default.parallelism": str(max(2, cores)),
    }


def _heap_mib() -> int:
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1024
    return max(1024, min(8192, total // 4 // 2**20))


def build_session(
    master: str | None = "local[*]",
    *,
    conf: Mapping[str, str] | None = None,
    app_name: str = APP_NAME,
    class_cache: bool = False,
) -> SparkSession:
    """A new session (or the running one: Spark keeps one per process) on ``master``.

    ``master`` None: the one spark-submit set. ``conf`` (``--conf``) comes last: a caller's
    setting wins over every default here. ``class_cache``: a local JVM maps (or dumps) the
    class cache (``kapok.analytics.classcache``); stop the session with ``stop_session``.
    """
    require_runtime()
    local = master is not None and master.startswith("local")
    if local:
        # The JVM and the Python workers read these at start; a caller's own choice stays.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        # Parquet timestamps as INT64 microseconds adjusted to UTC, not the legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.showConsoleProgress": "false",
        **local_conf(master),
        **(conf or {}),
    }
    if local:
        # Errors only from Spark's loggers (the driver is this machine's JVM; on a cluster
        # the cluster's own log settings rule). Other JVM options a caller gives are kept.
        global _CLASS_CACHE
        log_option = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
        extra = settings.get("spark.driver.extraJavaOptions", "")
        _CLASS_CACHE = local_class_cache(extra) if class_cache else None
        cached = "" if _CLASS_CACHE is None else _CLASS_CACHE.options()
        settings["spark.driver.extraJavaOptions"] = (
            f"{log_option} {LOCAL_JVM_OPTIONS} {cached} {extra}".strip()
        )
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # the JVM did not start: say why in one line
        raise AnalyticsError(f"Spark did not start: {first_line(exc)}") from exc
    session.sparkContext.setLogLevel("ERROR")
    return session


def local_class_cache(java_options: str = "") -> classcache.ClassCache | None:
    """The class cache a local session with the caller's ``java_options`` maps (or dumps)."""
    return classcache.for_session(java_executable() or "java", _jars(), LOCAL_JVM_OPTIONS, java_options)


def stop_session(session: SparkSession, *, read_files: bool = True) -> None:
    """Stop a session ``build_session`` made; when its JVM dumps the class cache
    (``kapok.analytics.classcache``), end that JVM too and keep the dump if the session
    ``read_files``."""
    from pyspark import SparkContext

    gateway = session.sparkContext._gateway
    session.stop()
    if _CLASS_CACHE is not None and _CLASS_CACHE.pending is not None:
        _CLASS_CACHE.finish(gateway, keep=read_files)
        # The JVM is gone: a later session in this process starts another one.
        SparkContext._gateway = None
        SparkContext._jvm = None


def _jars() -> Path:
    """Spark's jars: ``$SPARK_HOME``'s, else those pyspark ships."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    origin = spec.origin if spec is not None else None
    return Path(origin).parent / "jars" if origin else Path(".")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (Spark's run to pages)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def driver_heap(session: SparkSession) -> str:
    """The driver JVM's heap setting (``spark.driver.memory``; Spark's default is 1g)."""
    return session.sparkContext.getConf().get("spark.driver.memory") or "1g"


def jvm_death(session: SparkSession, heap: str | None = None) -> AnalyticsError | None:
    """The error to report if the session's JVM has died or is exiting, else None.

    The exit status or signal is known when this process started the JVM (an exiting
    one is waited for, ``REAP_WAIT_S`` at most); under spark-submit only that the JVM
    no longer answers. ``heap`` (``driver_heap``, read while it lived) goes into the advice.
    """
    gateway: Any = session.sparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if proc is None or proc.poll() is None:
        if _running(session):
            return None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                # A JVM that dumps the class cache writes it as it exits, even as it dies.
                dumping = _CLASS_CACHE is not None and _CLASS_CACHE.pending is not None
                proc.wait(classcache.EXIT_WAIT_S if dumping else REAP_WAIT_S)
    # Py4J sends it nothing more: its finalizer thread would log a traceback for each try.
    gateway._gateway_client.is_connected = False
    return AnalyticsError(death_message(None if proc is None else proc.returncode, heap))


def _running(session: SparkSession) -> bool:
    """Whether the JVM answers and its SparkContext runs (out of memory, Spark stops it
    and exits: a call fails before the JVM is gone)."""
    from py4j.protocol import Py4JError

    java_context: Any = session.sparkContext._jsc
    if java_context is None:  # stopped from Python: not a death
        return True
    try:
        return not java_context.sc().isStopped()
    except (Py4JError, OSError):
        return False


def death_message(status: int | None, heap: str | None) -> str:
    """One line: how the JVM died (``status`` as ``Popen.returncode``: -N for signal N;
    None when unknown) and, when memory may be why, a bigger heap to try."""
    bigger = f"a bigger heap than its {heap}" if heap else "a bigger heap"
    setting = f"--conf spark.driver.memory={_doubled(heap) or '<size>'}"
    if status == OOM_STATUS:
        return f"the Spark JVM died: out of memory (exit status {status}); give it {bigger}: {setting}"
    if status is None:
        how = "it no longer answers"
    elif status < 0:
        try:
            sig = signal.Signals(-status)
        except ValueError:
            how = f"killed by signal {-status}"
        else:
            if sig in STOP_SIGNALS:  # stopped on purpose: memory is not why
                return f"the Spark JVM died: stopped by {sig.name} (signal {-status})"
            how = f"killed by {sig.name} (signal {-status})"
    else:
        how = f"exit status {status}"
    return f"the Spark JVM died: {how}; if it ran out of memory, give it {bigger}: {setting}"


_UNIT_MIB: Final = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 2**20}


def _doubled(heap: str | None) -> str | None:
    """Twice a JVM memory size (``1g``, ``6026m``; MiB without a unit), up to whole GiB."""
    found = re.fullmatch(r"(\d+)([kmgt]?)b?", (heap or "").strip().lower())
    if found is None:
        return None
    return f"{math.ceil(2 * int(found[1]) * _UNIT_MIB[found[2]] / 1024)}g"


class _Py4JNoise(logging.Filter):
    """Drops the records Py4J logs to the root logger (from its ``send_command``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from py4j import java_gateway

        source: str = java_gateway.__file__
        return record.pathname != source


_PY4J_NOISE: Final = _Py4JNoise()


def _broken_update(server: Any, request: Any, client_address: Any) -> None:
    logging.getLogger(__name__).debug("a task's accumulator update from %s broke off", client_address)


def quiet_py4j() -> None:
    """Keep Py4J's tracebacks off stderr: on a broken connection it logs one to the root
    logger, while the caller gets the same failure as an exception (and says it in one line).
    The same for PySpark's accumulator server, which the JVM tells each Python task's
    updates: a JVM that dies while telling one would make ``socketserver`` print a traceback."""
    logging.getLogger().addFilter(_PY4J_NOISE)
    from pyspark import accumulators

    for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
        server = getattr(accumulators, name, None)
        if server is not None:
            server.handle_error = _broken_update
