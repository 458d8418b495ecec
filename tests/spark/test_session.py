"""The local session's settings that matter, read back from its own JVM."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from kapok.analytics.session import local_conf


def test_a_local_session_gets_a_heap_sized_to_the_machine(spark: SparkSession) -> None:
    # Spark's own 1 GiB ran out of memory at 5,000,000 archived events.
    wanted_mib = int(local_conf("local[2]")["spark.driver.memory"].removesuffix("m"))
    assert 1024 <= wanted_mib <= 8192
    jvm: Any = spark.sparkContext._jvm
    max_mib = jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20
    assert max_mib >= 0.9 * wanted_mib  # the JVM got it (the heap reports a little less)
    assert local_conf("spark://cluster:7077") == {}  # a cluster's own settings rule
