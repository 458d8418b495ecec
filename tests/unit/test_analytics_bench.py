"""The analytics benchmark's own parts (the benchmark itself runs by hand: it times Spark)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from kapok.analytics.bench import write_archive
from kapok.analytics.proctree import tree_usage
from kapok.storage.archive import list_archive_files, read_archive_file


def test_the_generated_archive_reads_like_a_nodes(tmp_path: Path) -> None:
    size = write_archive(tmp_path / "archive", 2000, topics=3, days=1.0)
    files = list_archive_files(tmp_path / "archive")
    assert sum(f.size for f in files) == size
    events = [e for f in files for e in read_archive_file(f.path)]
    assert len(events) == 2000
    kinds = Counter(e["ev"] for e in events)
    assert kinds["published"] > kinds["dead_lettered"] > 0 and kinds["retried"] > 0
    assert kinds["delivered"] > kinds["published"] > kinds["acked"] > 0  # redeliveries, dead letters
    assert {e["topic"] for e in events} == {"topic-0", "topic-1", "topic-2"}
    assert all(e["ev"] != "published" or e["create_time"] == e["t"] for e in events)


def test_tree_usage_sees_this_process() -> None:
    rss, cpu = tree_usage(os.getpid())
    assert rss > 10 * 2**20 and cpu > 0
    assert tree_usage(2**22 + 7) == (0, 0.0)  # no such process
