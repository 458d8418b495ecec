"""The SparkSession of ``kapok analytics``: checks first, then local defaults that matter.

Spark needs Java (17 or 21 for Spark 4) and, for Python data sources, pyarrow; both are
checked before the JVM starts so that their absence is one clear line, not a page of
Java. On a ``local[…]`` master the driver binds to loopback (else Spark binds the
machine's outward interface), the UI stays off, Python workers run this interpreter
(so they import the same kapok and pyarrow), shuffles use a few partitions instead
of 200, and the heap is a quarter of the machine's memory (1 to 8 GiB), not 1 GiB.
Every session computes in UTC and writes Parquet timestamps as INT64 microseconds
(UTC-adjusted).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from kapok.errors import AnalyticsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["build_session", "java_executable", "require_runtime"]

APP_NAME: Final = "kapok analytics"
LOG_CONFIG: Final = Path(__file__).with_name("log4j2.properties")
INSTALL_HINT: Final = "pip install 'kapok[analytics]'"
JAVA_HINT: Final = (
    "install a Java runtime 17 or 21 (Debian: apt-get install default-jre-headless) or set JAVA_HOME"
)


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
    master: str | None = "local[*]", *, conf: Mapping[str, str] | None = None, app_name: str = APP_NAME
) -> SparkSession:
    """A new session (or the running one: Spark keeps one per process) on ``master``.

    ``master`` None: the one spark-submit set. ``conf`` (``--conf``) comes last: a caller's
    setting wins over every default here.
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
        log_option = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
        extra = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = f"{log_option} {LOCAL_JVM_OPTIONS} {extra}".strip()
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # the JVM did not start: say why in one line
        raise AnalyticsError(f"Spark did not start: {first_line(exc)}") from exc
    session.sparkContext.setLogLevel("ERROR")
    return session


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (Spark's run to pages)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__
