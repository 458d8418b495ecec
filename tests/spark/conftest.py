"""The test run's one SparkSession (local[2], small shuffles, UI off, UTC), started at first use.

Every test here is marked ``spark``. Without PySpark or Java they are skipped with the
reason, except under CI (``CI`` set), where that is a broken install and fails. Their time
bounds scale with ``KAPOK_TEST_SLOW`` (``kapok.testing.slow``): pytest-timeout's limit per
test (tests/conftest.py), a query's ``awaitTermination``, and Spark's own network time-out
(how long the driver waits for an executor's heartbeat, 120 s by default).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kapok.errors import AnalyticsError
from kapok.testing.slow import scaled

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark_runtime() -> None:
    """Skip without Java or PySpark, except on CI, where their absence is a failure."""
    from kapok.analytics.session import require_runtime

    try:
        require_runtime()
    except AnalyticsError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Spark here: {exc.message}")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, spark_runtime: None) -> Iterator[SparkSession]:
    from kapok.analytics.session import build_session

    session = build_session(
        "local[2]",
        app_name="kapok tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse")),
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp_path_factory.mktemp('jvm-tmp')}",
            "spark.network.timeout": f"{round(scaled(120))}s",
        },
    )
    from kapok.analytics.stream import register

    register(session)
    yield session
    session.stop()
