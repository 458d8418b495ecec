"""The line that says how the Spark JVM died, and when it suggests a bigger heap."""

from __future__ import annotations

import pytest

from kapok.analytics.session import death_message


def test_out_of_memory_asks_for_twice_the_heap() -> None:
    assert death_message(52, "1g") == (
        "the Spark JVM died: out of memory (exit status 52); "
        "give it a bigger heap than its 1g: --conf spark.driver.memory=2g"
    )


@pytest.mark.parametrize(
    ("heap", "bigger"), [("6026m", "12g"), ("1536", "3g"), ("2G", "4g"), ("524288k", "1g"), ("1t", "2048g")]
)
def test_the_suggested_heap_is_twice_in_whole_gib(heap: str, bigger: str) -> None:
    assert death_message(-9, heap).endswith(f"than its {heap}: --conf spark.driver.memory={bigger}")


def test_a_kill_or_an_unknown_end_may_be_memory_a_stop_is_not() -> None:
    assert death_message(-9, "1g").startswith(
        "the Spark JVM died: killed by SIGKILL (signal 9); if it ran out of memory, give it a bigger heap"
    )
    assert death_message(1, "1g").startswith("the Spark JVM died: exit status 1; if it ran out of memory")
    assert death_message(None, None) == (
        "the Spark JVM died: it no longer answers; if it ran out of memory, "
        "give it a bigger heap: --conf spark.driver.memory=<size>"
    )
    assert death_message(-15, "1g") == "the Spark JVM died: stopped by SIGTERM (signal 15)"
