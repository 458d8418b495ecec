"""What the job writes and reads beside its tables on a local disk, without Spark
(``kapok.analytics.files``): the carried events, and a table read back for the summary."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kapok.analytics import reading
from kapok.analytics.files import read_local_table, write_events

SCHEMA = pa.schema(
    [("topic", pa.string()), ("acked", pa.int64()), ("ratio", pa.float64()), ("day", pa.string())]
)


def test_a_table_laid_out_as_spark_does_reads_back_with_its_days_and_nulls_for_new_columns(
    tmp_path: Path,
) -> None:
    table = tmp_path / "daily"
    for day, rows in (("2026-03-01", {"topic": ["a"], "acked": [3]}), ("2026-03-02", None)):
        part = table / f"day={day}"
        part.mkdir(parents=True)
        if rows is None:  # written by a later version: every column
            rows = {"topic": ["a", "b"], "acked": [1, 2], "ratio": [0.5, 0.25]}
        # Spark's own names, its checksums and its marker are beside the data files.
        pq.write_table(pa.table(rows), part / "part-00000-0c1d.c000.snappy.parquet")
        (part / ".part-00000-0c1d.c000.snappy.parquet.crc").write_bytes(b"crc")
    (table / "_SUCCESS").touch()
    (table / ".spark-staging-1").mkdir()
    read = read_local_table(str(table), SCHEMA)
    assert read is not None and read.schema == SCHEMA
    assert sorted(read.to_pylist(), key=lambda r: (r["day"], r["topic"])) == [
        {"topic": "a", "acked": 3, "ratio": None, "day": "2026-03-01"},  # the column came later
        {"topic": "a", "acked": 1, "ratio": 0.5, "day": "2026-03-02"},
        {"topic": "b", "acked": 2, "ratio": 0.25, "day": "2026-03-02"},
    ]
    assert read_local_table(f"file://{table}", SCHEMA) is not None  # a file: URI is a local path
    assert read_local_table(str(tmp_path / "none"), SCHEMA) is None


def test_carried_events_are_one_parquet_file_and_a_marker_replacing_what_was_there(tmp_path: Path) -> None:
    uri = str(tmp_path / "_kapok_carried" / "run-1")
    events = reading.EVENT_FIELDS.empty_table()
    write_events(None, events, uri)  # type: ignore[arg-type]  # a local disk needs no Spark
    (tmp_path / "_kapok_carried" / "run-1" / "stale.parquet").write_bytes(b"x")
    rows = pa.table({field.name: pa.array([None, None], field.type) for field in events.schema}).set_column(
        0, "ev", pa.array(["published", "acked"])
    )
    write_events(None, rows, uri)  # type: ignore[arg-type]
    root = Path(uri)
    assert sorted(p.name for p in root.iterdir()) == ["_SUCCESS", "part-00000.parquet"]
    back = pq.read_table(root / "part-00000.parquet")
    assert back.schema == reading.EVENT_FIELDS and back["ev"].to_pylist() == ["published", "acked"]
