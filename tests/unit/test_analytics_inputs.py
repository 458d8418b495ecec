"""``kapok analytics`` before Spark: what --input names, --since, and the one-line errors."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kapok.analytics.inputs import default_output, parse_duration, resolve_inputs
from kapok.cli import main
from kapok.errors import AnalyticsError

EVENT = json.dumps({"ev": "published", "code": "a", "topic": "t", "t": 1.0}) + "\n"


def _archive_file(directory: Path, n: int, text: str = EVENT) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"archive-20260301T000000-{n}.jsonl"
    path.write_text(text)
    return path


def test_a_storage_dir_means_its_archive_and_is_the_default_output(tmp_path: Path) -> None:
    store = tmp_path / "data"
    files = [_archive_file(store / "archive", n) for n in (1, 0)]
    (store / "archive" / "notes.txt").write_text("not read")
    inputs = resolve_inputs([str(store)])
    assert inputs.sources == [str(files[1]), str(files[0])]
    assert (inputs.local_files, inputs.local_bytes) == (2, 2 * len(EVENT))
    assert default_output(inputs) == str(store / "analytics")


def test_a_fresh_node_has_no_archive_yet_and_that_is_no_error(tmp_path: Path) -> None:
    (tmp_path / "data" / "wal").mkdir(parents=True)
    inputs = resolve_inputs([str(tmp_path / "data")])
    assert inputs.sources == [] and inputs.storage_dir == tmp_path / "data"


def test_folders_files_globs_and_uris(tmp_path: Path) -> None:
    a = _archive_file(tmp_path / "a", 0)
    b = _archive_file(tmp_path / "b", 7, EVENT + '{"ev": "ac')  # a torn last line is fine
    torn_only = _archive_file(tmp_path / "c", 1, '{"ev": "pub')  # one cut line: nothing to judge by
    inputs = resolve_inputs(
        [str(tmp_path / "a"), str(b), str(tmp_path / "c" / "*.jsonl"), "hdfs://nn/archive/"]
    )
    assert inputs.sources == [str(a), str(b), str(torn_only), "hdfs://nn/archive/"]
    assert inputs.local_files == 3 and inputs.storage_dir is None
    with pytest.raises(AnalyticsError, match="--output is needed"):
        default_output(inputs)


@pytest.mark.parametrize(
    ("uri", "source"),
    [
        ("hdfs://host/data", "hdfs://host/data/archive"),  # a storage dir: its archive/
        ("s3a://bucket/nodes/n1/data/", "s3a://bucket/nodes/n1/data/archive"),
        ("hdfs://nn/archive/", "hdfs://nn/archive/"),  # an archive folder already
        ("hdfs://nn/x/archive-*.jsonl", "hdfs://nn/x/archive-*.jsonl"),  # a glob
        ("s3a://b/n1/archive-20260301T000000-0.jsonl", "s3a://b/n1/archive-20260301T000000-0.jsonl"),
    ],
)
def test_a_storage_dir_given_as_a_uri_means_its_archive(uri: str, source: str) -> None:
    inputs = resolve_inputs([uri])  # nothing checked locally: no such host here
    assert inputs.sources == [source] and inputs.local_files == 0


def test_a_storage_dir_given_as_a_file_uri_means_its_archive(tmp_path: Path) -> None:
    store = tmp_path / "data"
    file = _archive_file(store / "archive", 0)
    inputs = resolve_inputs([f"file://{store}"])
    assert inputs.sources == [str(file)] and inputs.storage_dir == store


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "no such file or directory"),
        (lambda p: p.mkdir(), "not an archive"),
        (lambda p: p.write_text("hello\nworld\n"), "not an archive"),
        (lambda p: p.write_text('{"no": "ev"}\n'), "not an archive"),
    ],
)
def test_unusable_inputs_are_one_clear_error(
    tmp_path: Path, setup: Callable[[Path], object], message: str
) -> None:
    path = tmp_path / "input"
    setup(path)
    with pytest.raises(AnalyticsError, match=message):
        resolve_inputs([str(path)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = _archive_file(tmp_path, 0)
    path.chmod(0)
    with pytest.raises(AnalyticsError, match="cannot read it"):
        resolve_inputs([str(path)])


def test_a_glob_that_matches_nothing(tmp_path: Path) -> None:
    with pytest.raises(AnalyticsError, match="no file matches"):
        resolve_inputs([str(tmp_path / "*.jsonl")])


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "30m", "12h", "7d", "2w", "45", "1.5h")] == [
        90,
        1800,
        43200,
        604800,
        1209600,
        45,
        5400,
    ]
    for bad in ("", "7y", "-3d", "0", "d"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def test_cli_errors_are_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analytics", "--input", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kapok: error: input ") and "no such file" in err
    assert main(["analytics", "--input", str(tmp_path), "--since", "soon"]) == 2
    assert "not a duration" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs the analytics extra")
def test_no_java_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "data"
    _archive_file(store / "archive", 0)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    assert main(["analytics", "--input", str(store)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Spark needs Java" in err and "default-jre-headless" in err
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert main(["analytics", "--input", str(store)]) == 1
    assert "JAVA_HOME has no bin/java" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs the analytics extra")
def test_spark_settings_are_key_value_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kapok.analytics import command

    assert command.conf_pairs(["spark.executor.memory=4g", "spark.a= x=y ", "spark.b="]) == {
        "spark.executor.memory": "4g",
        "spark.a": " x=y ",  # the value as given: only the key is trimmed
        "spark.b": "",
    }
    for bad in ("spark.executor.memory", "=4g", " =4g"):
        with pytest.raises(ValueError, match="key=value"):
            command.conf_pairs([bad])
        assert main(["analytics", "--input", str(tmp_path), "--conf", bad]) == 2
        assert "must be KEY=VALUE" in capsys.readouterr().err
    # What --conf gives reaches the session; without --master, spark-submit's master or local[*].
    seen: list[tuple[str | None, dict[str, str]]] = []
    monkeypatch.setattr(
        command, "build_session", lambda master, conf, class_cache: seen.append((master, conf))
    )
    monkeypatch.setattr("pyspark.sql.SparkSession.getActiveSession", lambda: None)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    command._session(None, {"spark.executor.memory": "4g"})
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")
    command._session(None, {})
    command._session("yarn", {})
    assert seen == [("local[*]", {"spark.executor.memory": "4g"}), (None, {}), ("yarn", {})]


def test_the_ledger_compares_the_set_of_inputs_by_absolute_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kapok.analytics.command import input_names

    monkeypatch.chdir(tmp_path)
    assert input_names(["b", "hdfs://nn/data", f"file://{tmp_path}/a", "b"]) == sorted(
        [str(tmp_path / "b"), "hdfs://nn/data", str(tmp_path / "a")]
    )
