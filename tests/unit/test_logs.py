"""Logging: both formats name the node, secrets are masked (tracebacks too), the file
rotates by size, and the archiver's records come back through the node's handlers."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kapok.logs
from kapok.config import load_config
from kapok.logs import NodeFormatter, relog, set_node, setup_child, setup_logging
from kapok.node.runner import _warn_plain_traffic

KEY, GOSSIP = "kq-distinct-key-7781", "gz-distinct-gossip-3312"


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test configures the root logger; give it back as it was."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(kapok.logs, "_handler", None)
    yield
    if kapok.logs._handler is not None:
        kapok.logs._handler.close()


def record(
    message: str, *args: object, name: str = "kapok.test", level: int = logging.INFO
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def test_human_lines_name_the_node() -> None:
    line = NodeFormatter(json=False, node="m1").format(record("listening on %s", "http://x"))
    assert line.endswith(" INFO m1 kapok.test: listening on http://x")


def test_json_lines_have_time_level_logger_node_message() -> None:
    out = json.loads(NodeFormatter(json=True, node="m1").format(record("hello %d", 3, level=logging.WARNING)))
    assert set(out) == {"time", "level", "logger", "node", "message"}
    assert (out["level"], out["logger"], out["node"], out["message"]) == (
        "WARNING",
        "kapok.test",
        "m1",
        "hello 3",
    )
    assert out["time"].endswith("Z") and len(out["time"]) == len("2026-11-24T06:49:39.752Z")


@pytest.mark.parametrize("as_json", [False, True])
def test_secrets_are_masked_in_messages_and_tracebacks(as_json: bool) -> None:
    formatter = NodeFormatter(json=as_json, node="m1", secrets=[KEY, GOSSIP, "test", ""])
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        rec = logging.LogRecord("kapok", logging.ERROR, __file__, 1, "got %s and %s", (KEY, GOSSIP), None)
        rec.exc_info = sys.exc_info()
    line = formatter.format(rec)
    assert KEY not in line and GOSSIP not in line
    assert line.count("(hidden)") == 3  # twice in the message, once in the traceback
    # The shipped key is no secret: masking it would mangle every topic called "test".
    assert "topic test" in formatter.format(record("topic test"))


@pytest.mark.parametrize("as_json", [False, True])
def test_secrets_are_masked_whatever_their_case_and_url_encoding(as_json: bool) -> None:
    secret = "Pa ss/W0rd&Mixed"
    formatter = NodeFormatter(json=as_json, node="m1", secrets=[secret, "test"])
    # aiohttp's error text lower-cases a URL, user:secret@ of replication.master included.
    master = f"http://kapok:{secret}@10.0.0.7:8011"
    lowered = f"Cannot connect to host {master.lower()} ssl:default"
    line = formatter.format(record("replication: %s; %s; %s", lowered, master.upper(), master))
    assert secret.lower() not in line.lower()
    assert line.count("(hidden)") == 3
    # ... or percent-encodes it (quote, quote_plus), in any case.
    encoded = formatter.format(record("GET /x?k=Pa%20ss%2fW0rd%26Mixed and k=PA+SS%2FW0RD%26MIXED"))
    assert "w0rd" not in encoded.lower() and encoded.count("(hidden)") == 2
    assert "topic TEST" in formatter.format(record("topic TEST"))  # the shipped key, still left alone


def test_setup_logs_to_stderr_with_the_node_name_then_the_real_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = load_config(None, overrides=["server.port=0", f"mq.secret_key={KEY}"], env={})
    setup_logging(config)
    logging.getLogger("kapok.x").info("before binding, key %s", KEY)
    set_node("127.0.0.1:40111")
    logging.getLogger("kapok.x").debug("not at info level")
    logging.getLogger("kapok.x").info("after binding")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 3)[3] for line in lines] == [
        "127.0.0.1:0 kapok.x: before binding, key (hidden)",
        "127.0.0.1:40111 kapok.x: after binding",
    ]


def test_a_log_file_rotates_by_size_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "node.log"  # the folder is made
    config = load_config(
        None, env={}, overrides=[f"log.file={path}", "log.max_bytes=2000", "log.backups=2", "log.format=json"]
    )
    setup_logging(config, node="m1")
    for i in range(100):
        logging.getLogger("kapok.x").info("line %03d %s", i, "x" * 50)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2"]
    assert all(p.stat().st_size <= 2000 for p in path.parent.iterdir())
    last = [json.loads(line) for line in path.read_text().splitlines()][-1]
    assert (last["node"], last["message"][:8]) == ("m1", "line 099")


def test_setting_up_again_replaces_only_its_own_handler() -> None:
    config = load_config(None, env={})
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    setup_logging(config)
    setup_logging(config)
    ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, NodeFormatter)]
    assert len(ours) == 1 and other in logging.getLogger().handlers


def test_archiver_records_are_logged_by_the_node(tmp_path: Path) -> None:
    pipe = io.StringIO()
    setup_child("INFO", pipe)  # the child's end: JSON lines on its standard error
    logging.getLogger("kapok.storage").warning("archive file %s rotated", "a.jsonl")
    logging.getLogger("kapok.storage").debug("below the child's level")
    sent = pipe.getvalue().splitlines(keepends=True)
    assert len(sent) == 1

    path = tmp_path / "node.log"  # the node's end, which formats and writes them
    setup_logging(load_config(None, env={}, overrides=[f"log.file={path}", "log.format=json"]), node="m1")
    fields = {"time": "2020-01-02T03:04:05.678Z", "level": "INFO", "logger": "kapok.storage"}
    fields["message"] = "old"
    old = json.dumps(fields) + "\n"
    for line in [*sent, old, "Traceback (most recent call last):\n", "\n"]:
        relog(line, "kapok.storage.archiver")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["level"], x["node"], x["logger"], x["message"]) for x in lines] == [
        ("WARNING", "m1", "kapok.storage", "archive file a.jsonl rotated"),
        ("INFO", "m1", "kapok.storage", "old"),
        ("ERROR", "m1", "kapok.storage.archiver", "Traceback (most recent call last):"),
    ]
    assert lines[0]["time"] == json.loads(sent[0])["time"]  # the child's time, not the relay's
    assert lines[1]["time"] == "2020-01-02T03:04:05.678Z"


@pytest.mark.parametrize(("sets", "warned"), [((), 0), (("server.host=0.0.0.0", f"mq.secret_key={KEY}"), 1)])
def test_plain_traffic_off_loopback_is_a_warning(
    sets: tuple[str, ...], warned: int, caplog: pytest.LogCaptureFixture
) -> None:
    _warn_plain_traffic(load_config(None, overrides=list(sets), env={}))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == warned and all("travel unencrypted" in line for line in lines)
