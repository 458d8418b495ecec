"""``python -m kapok.bench.storage`` runs end to end on a small count and reports its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kapok.bench.storage import main

ROWS = (
    "messages",
    "snapshot write s",
    "snapshot bytes",
    "bytes/message",
    "recovery s",
    "RSS after populate",
    "RSS after recovery",
)


def test_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--messages", "2000", "--dir", str(tmp_path / "data")]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    for row in ROWS:
        assert any(line.startswith(row + " ") for line in lines), (row, out)
    assert "2,000" in lines[0]
    assert "same state" in out
    assert "bench: recovering" in err  # progress goes to stderr, not into the table
    assert any((tmp_path / "data" / "snapshots").glob("snapshot-*.snap"))


def test_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--messages", "2000", "--payload", "50", "--json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    figures = json.loads(out)
    assert err == ""
    assert figures["messages"] == 2000 and figures["payload_bytes"] == 50
    assert figures["recovered_ok"] is True
    assert figures["recovered_messages"] == 2000
    assert figures["live_messages"] == figures["recovered_live_messages"] < 2000  # some were acked
    assert figures["delivered"] == 1000 and 0 < figures["acked"] < 1000
    assert figures["snapshot_bytes"] > 2000 * 50
    assert figures["bytes_per_message"] == figures["snapshot_bytes"] / 2000
    for key in ("snapshot_s", "recovery_s", "populate_s"):
        assert figures[key] >= 0
    for key in ("rss_populated_bytes", "rss_recovered_bytes", "peak_rss_bytes"):
        assert figures[key] > 0
    assert not Path(figures["dir"]).exists()  # the temporary directory is removed


def test_refuses_a_directory_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "something").write_text("x")
    assert main(["--messages", "10", "--dir", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
