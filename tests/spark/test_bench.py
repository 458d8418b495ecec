"""The analytics benchmark's split of the JVM's CPU by thread role, on the tests' own JVM."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from kapok.analytics.proctree import jvm_threads, tree_usage


def test_the_jvms_cpu_splits_into_tasks_jit_gc_and_the_rest(spark: SparkSession) -> None:
    before = jvm_threads(os.getpid())  # the session's JVM is a child of this process
    assert spark.range(2_000_000).selectExpr("sum(id * 3)").first() == (3 * 1_999_999 * 2_000_000 // 2,)
    after = jvm_threads(os.getpid())
    assert set(after) == {"jit", "gc", "tasks", "other"}
    assert after["tasks"] > before["tasks"]  # the job ran on Spark's task threads
    assert after["jit"] > 0 and after["other"] > 0  # the JVM compiled, and planned
    assert sum(after.values()) <= tree_usage(os.getpid())[1] + 0.1  # a part of the tree's CPU
