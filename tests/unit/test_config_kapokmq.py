"""KapokMQ's application.yaml read as a Kapok configuration: detection, the key table,
one note per key, errors named after the KapokMQ key, and the file `kapok config convert`
writes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from kapok.config import convert_kapokmq_file, load_config
from kapok.config.kapokmq import KAPOKMQ_KEYS, Note, is_kapokmq, translate
from kapok.errors import ConfigError

# KapokMQ's shipped file, as its spec (§4) gives every key and default.
SHIPPED: dict[str, dict[str, Any]] = {
    "server": {"addr": "127.0.0.1", "port": 8011},
    "mq": {
        "secretKey": "test", "pushType": 1, "messageChanBuffer": 10000000, "pushMessagesSpeed": 1,
        "pushCount": 1000, "pushRetryTime": 300, "persistentFile": "MQDATA", "isPersistent": 0,
        "recoveryStrategy": 1, "persistentTime": 5, "isCleanConsumed": 0, "isRePush": 1, "isClean": 1,
        "checkSpeed": 5, "cleanTime": 172800,
    },
    "cluster": {"isCluster": 0, "gossipPort": 8021, "registryAddr": "127.0.0.1", "registryGossipPort": 8041},
    "sync": {
        "isSync": 0, "isSlave": 0, "masterProtocol": "ws", "masterAddr": "127.0.0.1", "masterPort": "8011",
    },
}  # fmt: skip


def with_(**changes: Any) -> dict[str, Any]:
    """SHIPPED with ``section__key=value`` changes (None removes the key)."""
    raw = {section: dict(body) for section, body in SHIPPED.items()}
    for name, value in changes.items():
        section, _, key = name.partition("__")
        if value is None:
            raw[section].pop(key, None)
        else:
            raw.setdefault(section, {})[key] = value
    return raw


def load(tmp_path: Path, raw: dict[str, Any], *sets: str) -> tuple[Any, list[Note]]:
    path = tmp_path / "application.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    notes: list[Note] = []
    return load_config(path, overrides=sets, env={}, notes=notes), notes


def test_detected_by_keys_only_kapokmq_has() -> None:
    assert is_kapokmq(SHIPPED)
    assert is_kapokmq({"sync": {"isSlave": 1}}) and is_kapokmq({"server": {"addr": "h"}})
    assert not is_kapokmq({"server": {"port": 8011, "host": "127.0.0.1"}, "mq": {"secret_key": "k"}})
    assert not is_kapokmq({})


def test_shipped_file_translates_by_the_readme_table(tmp_path: Path) -> None:
    config, notes = load(tmp_path, SHIPPED)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8011)
    assert (config.mq.secret_key, config.mq.push_type, config.mq.max_length) == ("test", 1, 10000000)
    assert config.mq.ack_timeout_s == 300.0 and config.mq.retain_consumed_s == 172800.0
    assert (config.storage.dir, config.storage.fsync, config.storage.snapshot_interval_s) == (
        "data",
        "never",
        5.0,
    )
    assert (config.cluster.enabled, config.cluster.bind, config.cluster.seeds) == (
        False, "127.0.0.1:8021", ("127.0.0.1:8041",)
    )  # fmt: skip
    assert config.replication.role == "master" and config.replication.master == ""
    # One note per key, in the file's order, after a first line naming the file.
    assert notes[0].key == "" and "is a KapokMQ configuration" in notes[0].text
    keys = [note.key for note in notes[1:]]
    assert sorted(keys) == sorted(f"{s}.{k}" for s, body in SHIPPED.items() for k in body)
    for note in notes[1:]:
        assert note.text.startswith(f"{note.key}: ") and " -> " in note.text
    assert all(key in KAPOKMQ_KEYS for key in keys)


@pytest.mark.parametrize(
    ("changes", "path", "expected"),
    [
        ({"mq__isPersistent": 1}, "storage.fsync", "interval"),
        ({"mq__isPersistent": 2}, "storage.fsync", "always"),
        ({"mq__isCleanConsumed": 1}, "mq.retain_consumed_s", 0.0),
        ({"mq__isClean": 0}, "mq.retain_consumed_s", 3600.0),  # Kapok's default stays
        ({"mq__persistentFile": "store/MQDATA"}, "storage.dir", "store/data"),
        ({"cluster__isCluster": True}, "cluster.enabled", True),
        ({"server__addr": "10.0.0.5", "mq__secretKey": "s3cret"}, "cluster.bind", "10.0.0.5:8021"),
        ({"server__port": "9011"}, "server.port", 9011),  # KapokMQ's ports are strings
    ],
)
def test_single_keys(tmp_path: Path, changes: dict[str, Any], path: str, expected: object) -> None:
    config, _ = load(tmp_path, with_(**changes))
    section, _, key = path.partition(".")
    assert getattr(getattr(config, section), key) == expected


def test_a_slave_names_its_master_by_url(tmp_path: Path) -> None:
    raw = with_(sync__isSync=1, sync__isSlave=1, sync__masterProtocol="wss", sync__masterAddr="10.0.0.1",
                server__port=8012)  # fmt: skip
    config, notes = load(tmp_path, raw)
    assert (config.replication.role, config.replication.master) == ("slave", "https://10.0.0.1:8011")
    said = {note.key: note.text for note in notes}
    assert said["sync.masterAddr"].endswith("-> replication.master: 'https://10.0.0.1:8011' (its host)")
    assert "-> ignored: not needed" in said["sync.isSync"]


def test_the_secret_is_never_in_a_note(tmp_path: Path) -> None:
    _, notes = load(tmp_path, with_(mq__secretKey="kq-very-secret-value"))
    assert not [note for note in notes if "kq-very-secret-value" in note.text]
    assert "mq.secretKey: (hidden) -> mq.secret_key: (hidden)" in [note.text for note in notes]


def test_behaviour_kapok_cannot_keep_is_a_warning(tmp_path: Path) -> None:
    _, notes = load(tmp_path, with_(mq__isRePush=0, mq__recoveryStrategy=0))
    warned = {note.key for note in notes if note.level == logging.WARNING}
    assert warned == {"mq.isRePush", "mq.recoveryStrategy"}


def test_kapok_keys_pass_through_and_overrides_still_win(tmp_path: Path) -> None:
    raw = with_(log__format="json")
    config, _ = load(tmp_path, raw, "server.port=9999")
    assert config.log.format == "json" and config.server.port == 9999


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mq__isRePush": "yes"}, "mq.isRePush: expected 0 or 1 (a KapokMQ flag), got 'yes'"),
        ({"mq__pushType": 3}, "mq.pushType (as mq.push_type): expected one of 1, 2, got 3"),
        ({"mq__pushRetryTime": 0}, "mq.pushRetryTime (as mq.ack_timeout_s): expected a number > 0, got 0.0"),
        ({"mq__isPersistent": 3}, "mq.isPersistent: expected one of 0, 1, 2, got 3"),
        ({"server__port": "80x"}, "server.port: expected a non-negative integer, got '80x'"),
        ({"mq__secret_key": "k"}, "mq.secret_key: given both as a Kapok key and as KapokMQ's mq.secretKey"),
        ({"sync__isSync": 1, "sync__isSlave": 1, "sync__masterAddr": ""}, "sync.masterAddr: required"),
        (
            {"sync__isSync": 1, "sync__isSlave": 1, "sync__masterProtocol": "tcp"},
            "sync.masterProtocol: expected",
        ),
        ({"sync__extra": 1}, "sync.extra: unknown key"),
        ({"server__addr": "0.0.0.0"}, "mq.secret_key: refusing to start"),  # the shipped key, off loopback
    ],
)
def test_bad_values_are_one_error_naming_the_kapokmq_key(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, with_(**changes))
    assert info.value.message.startswith(message), info.value.message
    assert "\n" not in info.value.message


def test_translate_leaves_the_input_alone() -> None:
    raw = with_()
    translate(raw)
    assert raw == with_()


def test_convert_writes_a_kapok_file_with_every_note_as_a_comment(tmp_path: Path) -> None:
    source = tmp_path / "kapokmq.yaml"
    source.write_text(yaml.safe_dump(with_(mq__secretKey="s3cret-key")), encoding="utf-8")
    text = convert_kapokmq_file(source)
    comments = [line for line in text.splitlines() if line.startswith("#   ")]
    assert len(comments) == sum(len(body) for body in SHIPPED.values())
    converted = yaml.safe_load(text)
    assert not is_kapokmq(converted)
    assert converted["mq"]["secret_key"] == "s3cret-key"  # the file must work: the key is in it
    target = tmp_path / "kapok.yaml"
    target.write_text(text, encoding="utf-8")
    assert load_config(target, env={}) == load_config(source, env={})


def test_convert_refuses_a_kapok_file(tmp_path: Path) -> None:
    path = tmp_path / "application.yaml"
    path.write_text("server: {port: 1}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a KapokMQ configuration"):
        convert_kapokmq_file(path)
