"""kapok.config: defaults, layering (file <- env <- --set), validation messages."""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kapok.cluster.config import SwimConfig
from kapok.cluster.node import swim_config
from kapok.config import (
    ClusterConfig,
    Config,
    FrozenMap,
    GossipTuning,
    MqConfig,
    ServerConfig,
    TopicOverride,
    env_var_name,
    is_loopback,
    load_config,
    public_dict,
    validate_config,
)
from kapok.config.convert import build
from kapok.config.schema import _overrides_of
from kapok.core.settings import TopicSettings
from kapok.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "application.yaml"


def load(*overrides: str, env: dict[str, str] | None = None, path: Path | None = None) -> Config:
    return load_config(path, overrides=overrides, env={} if env is None else env)


def error_of(*overrides: str, env: dict[str, str] | None = None, path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(*overrides, env=env, path=path)
    return str(info.value)


def leaf_paths(tree: dict[str, object], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in tree.items():
        if isinstance(value, dict) and key != "topics":
            out |= leaf_paths(value, f"{prefix}{key}.")
        else:
            out.add(prefix + key)
    return out


# --- defaults ---------------------------------------------------------------------------

EXPECTED_DEFAULTS: dict[str, object] = {
    "server.host": "127.0.0.1",
    "server.port": 8011,
    "server.name": "",
    "server.max_connections": 10000,
    "server.auth_timeout_s": 10.0,
    "server.auth_max_attempts": 3,
    "server.heartbeat_s": 30.0,
    "server.busy_poll_us": 200,
    "server.send_queue_max_bytes": 16 * 1024 * 1024,
    "server.long_poll_max_s": 60.0,
    "server.max_batch": 1000,
    "server.header_timeout_s": 10.0,
    "server.body_timeout_s": 30.0,
    "server.idle_timeout_s": 75.0,
    "server.auth_backoff_after": 10,
    "server.auth_backoff_s": 1.0,
    "server.auth_backoff_max_s": 300.0,
    "server.tls_cert": "",
    "server.tls_key": "",
    "server.public_url": "",
    "mq.secret_key": "test",
    "mq.push_type": 1,
    "mq.ack_timeout_s": 60.0,
    "mq.max_deliveries": 5,
    "mq.prefetch": 100,
    "mq.max_prefetch": 10_000,
    "mq.max_backlog_bytes": 0,
    "mq.max_message_bytes": 1048576,
    "mq.dedup_window_s": 86400.0,
    "mq.dedup_max_entries": 1_000_000,
    "mq.max_length": 0,
    "mq.max_bytes": 0,
    "mq.overflow": "reject",
    "mq.ttl_s": 0.0,
    "mq.expired": "drop",
    "mq.retain_consumed_s": 3600.0,
    "mq.retain_consumed_max": 100_000,
    "mq.producer_rate": 0.0,
    "mq.producer_burst": 1000,
    "mq.topics": {},
    "storage.dir": "./data",
    "storage.fsync": "always",
    "storage.fsync_interval_ms": 10,
    "storage.snapshot_interval_s": 60.0,
    "storage.segment_max_bytes": 64 * 1024 * 1024,
    "storage.archive": True,
    "storage.archive_rotate_bytes": 64 * 1024 * 1024,
    "storage.archive_max_bytes": 1024 * 1024 * 1024,
    "storage.archive_max_age_s": 7 * 86400.0,
    "storage.min_free_bytes": 64 * 1024 * 1024,
    "cluster.enabled": False,
    "cluster.bind": "127.0.0.1:8021",
    "cluster.advertise": "",
    "cluster.seeds": [],
    "cluster.secret": [],
    "cluster.profile": "lan",
    **{f"cluster.tuning.{f.name}": None for f in dataclasses.fields(GossipTuning)},
    "replication.role": "master",
    "replication.master": "",
    "replication.mode": "sync",
    "replication.failover_timeout_s": 3.0,
    "replication.sync_timeout_ms": 1000,
    "replication.backlog_bytes": 67108864,
    "replication.give_back": True,
    "console.enabled": True,
    "console.session_idle_s": 8 * 3600.0,
    "console.refresh_s": 5.0,
    "console.analytics_dir": "",
    "metrics.require_key": False,
    "metrics.max_topics": 1000,
    "log.level": "info",
    "log.format": "human",
    "log.file": "",
    "log.max_bytes": 67108864,
    "log.backups": 5,
}


def test_defaults_are_the_documented_ones() -> None:
    tree = Config.default().to_dict()
    actual = {path: functools.reduce(operator.getitem, path.split("."), tree) for path in leaf_paths(tree)}
    assert actual == EXPECTED_DEFAULTS
    for path, value in EXPECTED_DEFAULTS.items():  # types too: 60.0 is a float, 1 an int
        assert type(actual[path]) is type(value), path


def test_no_file_no_overrides_gives_defaults() -> None:
    assert load() == Config.default()
    assert Config.default() == Config()


def test_shipped_application_yaml_equals_defaults() -> None:
    assert load_config(SHIPPED, env={}) == Config.default()


def test_shipped_application_yaml_spells_out_every_key() -> None:
    raw = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    assert leaf_paths(raw) == set(EXPECTED_DEFAULTS)


def test_config_is_frozen_and_hashable() -> None:
    config = load("mq.topics.orders.max_length=10", "cluster.seeds=[a:1]")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.port = 1  # type: ignore[misc]
    assert hash(config) == hash(load("mq.topics.orders.max_length=10", "cluster.seeds=[a:1]"))
    assert isinstance(config.mq.topics, FrozenMap)
    with pytest.raises(TypeError):
        config.mq.topics["x"] = TopicOverride()  # type: ignore[index]


def test_node_name() -> None:
    assert ServerConfig().node_name == "127.0.0.1:8011"
    assert ServerConfig(name="alpha").node_name == "alpha"
    assert ServerConfig(host="::1", port=9).node_name == "[::1]:9"


def test_to_dict_round_trips_through_yaml(tmp_path: Path) -> None:
    config = load("mq.topics.a.b.ttl_s=5", "cluster.seeds=[h:1, h:2]", "server.port=9")
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()), encoding="utf-8")
    assert load(path=path) == config


# --- file -------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "application.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_file_values_override_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "server: {port: 9011}\nmq: {ack_timeout_s: 5, topics: {orders: {max_length: 7}}}\n"
        "cluster: {seeds: ['10.0.0.1:8021']}\n",
    )
    config = load(path=path)
    assert config.server.port == 9011
    assert config.server.host == "127.0.0.1"  # untouched keys keep their default
    assert config.mq.ack_timeout_s == 5.0 and isinstance(config.mq.ack_timeout_s, float)
    assert config.mq.topic("orders").max_length == 7
    assert config.cluster.seeds == ("10.0.0.1:8021",)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file_is_defaults(tmp_path: Path, text: str) -> None:
    assert load(path=write(tmp_path, text)) == Config.default()


def test_path_may_be_a_string(tmp_path: Path) -> None:
    assert load_config(str(write(tmp_path, "log: {level: debug}\n")), env={}).log.level == "debug"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: [\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping of sections at the top level, got a list"),
        ("just a string\n", "expected a mapping of sections at the top level, got 'just a string'"),
        ("server:\n  port: 1\n  port: 2\n", "duplicate key 'port'"),
        ("server: 5\n", "server: expected a mapping, got 5"),
        ("serverr: {port: 1}\n", "serverr: unknown key; did you mean 'server'?"),
        ("mq: {topics: {orders: {max_lenght: 3}}}\n", "mq.topics.orders.max_lenght: unknown key"),
        ("mq: {topics: [a, b]}\n", "mq.topics: expected a mapping of topic name to settings"),
        ("mq: {topics: {orders: 3}}\n", "mq.topics.orders: expected a mapping, got 3"),
        ("mq: {topics: {'': {}}}\n", "mq.topics: topic names must be non-empty strings"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(path=write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    message = error_of(path=tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "not found" in message


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    assert "cannot read config file" in error_of(path=tmp_path)


# --- --set ------------------------------------------------------------------------------


def test_set_values_are_yaml() -> None:
    config = load(
        "server.port=9011",
        "cluster.enabled=true",
        "cluster.secret=s3",
        "cluster.seeds=[a:1, 'b:2']",
        "mq.ack_timeout_s=2.5",
        "mq.overflow=drop_oldest",
    )
    assert config.server.port == 9011
    assert config.cluster.enabled is True
    assert config.cluster.seeds == ("a:1", "b:2")
    assert config.mq.ack_timeout_s == 2.5
    assert config.mq.overflow == "drop_oldest"


def test_set_string_keys_keep_their_text() -> None:
    config = load("mq.secret_key=12345", "server.name=true", "server.host=::1", "storage.dir=")
    assert config.mq.secret_key == "12345"
    assert config.server.name == "true"
    assert config.server.host == "::1"
    assert config.storage.dir == ""
    assert load("mq.secret_key='quoted'").mq.secret_key == "quoted"


def test_set_topic_override_keys() -> None:
    config = load("mq.topics.orders.max_length=10", "mq.topics.orders.overflow=drop_oldest")
    assert config.mq.topics["orders"] == TopicOverride(max_length=10, overflow="drop_oldest")


def test_set_topic_names_may_contain_dots() -> None:
    config = load("mq.topics.orders.eu.max_length=3", "mq.topics.a.b.c={push_type: 2}")
    assert set(config.mq.topics) == {"orders.eu", "a.b.c"}
    assert config.mq.topic("orders.eu").max_length == 3
    assert config.mq.topic("a.b.c").push_type == 2


def test_set_merges_with_file_and_later_set_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "mq: {topics: {orders: {max_length: 5, ttl_s: 9}}}\nserver: {port: 1}\n")
    config = load("mq.topics.orders.max_length=6", "server.port=2", "server.port=3", path=path)
    assert config.mq.topics["orders"] == TopicOverride(max_length=6, ttl_s=9.0)
    assert config.server.port == 3


@pytest.mark.parametrize("item", ["server.port", "=5", "server..port=1", ".port=1", "server.=1"])
def test_malformed_set(item: str) -> None:
    assert "expected path=value" in error_of(item)


def test_set_value_not_yaml() -> None:
    assert error_of("server.port=[1").startswith("--set server.port: value is not valid YAML")


# --- environment ------------------------------------------------------------------------


def test_env_var_name() -> None:
    assert env_var_name("mq.secret_key") == "KAPOK_MQ_SECRET_KEY"
    assert env_var_name("server.port") == "KAPOK_SERVER_PORT"


def test_env_overrides() -> None:
    env = {
        "KAPOK_SERVER_PORT": "9000",
        "KAPOK_MQ_SECRET_KEY": "0123",
        "KAPOK_CLUSTER_SEEDS": "[a:1, b:2]",
        "KAPOK_CLUSTER_ENABLED": "true",
        "KAPOK_MQ_TOPICS": "{orders: {max_length: 4}}",
        "KAPOK_STORAGE_FSYNC_INTERVAL_MS": "25",
    }
    config = load(env=env)
    assert config.server.port == 9000
    assert config.mq.secret_key == "0123"
    assert config.cluster.seeds == ("a:1", "b:2")
    assert config.cluster.enabled is True
    assert config.mq.topic("orders").max_length == 4
    assert config.storage.fsync_interval_ms == 25


def test_env_list_may_be_comma_separated() -> None:
    assert load(env={"KAPOK_CLUSTER_SEEDS": "a:1, b:2"}).cluster.seeds == ("a:1", "b:2")
    assert load(env={"KAPOK_CLUSTER_SEEDS": ""}).cluster.seeds == ()


def test_layer_order_file_env_set(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {port: 1, max_batch: 7}\nmq: {prefetch: 3}\n")
    env = {"KAPOK_SERVER_PORT": "2", "KAPOK_MQ_PREFETCH": "4"}
    config = load("server.port=3", env=env, path=path)
    assert (config.server.port, config.mq.prefetch, config.server.max_batch) == (3, 4, 7)


def test_non_config_kapok_variables_are_ignored() -> None:
    env = {"KAPOK_HOME": "/x", "KAPOK_TEST_SEED": "1", "KAPOKX": "1", "PATH": "/bin"}
    assert load(env=env) == Config.default()


def test_unknown_config_variable_is_an_error() -> None:
    message = error_of(env={"KAPOK_SERVER_PROT": "1", "KAPOK_LOG_PATH": "x"})
    assert "KAPOK_SERVER_PROT" in message and "KAPOK_LOG_PATH" in message
    assert "did you mean KAPOK_SERVER_PORT" in message


def test_per_topic_variables_point_to_kapok_mq_topics() -> None:
    assert "KAPOK_MQ_TOPICS=" in error_of(env={"KAPOK_MQ_TOPICS_ORDERS_MAX_LENGTH": "1"})


def test_env_bad_value_names_the_key() -> None:
    assert error_of(env={"KAPOK_SERVER_PORT": "abc"}) == (
        "server.port: expected an integer between 0 and 65535, got 'abc'"
    )


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAPOK_SERVER_PORT", "8123")
    assert load_config().server.port == 8123


# --- per-topic settings -----------------------------------------------------------------


def test_topic_without_override_gets_mq_defaults() -> None:
    assert MqConfig().topic("anything") == TopicSettings(
        push_type=1,
        ack_timeout_s=60.0,
        max_deliveries=5,
        max_length=0,
        max_bytes=0,
        overflow="reject",
        ttl_s=0.0,
        retain_consumed_s=3600.0,
    )


def test_topic_override_merges_over_mq_defaults() -> None:
    config = load(
        "mq.push_type=2",
        "mq.ack_timeout_s=30",
        "mq.topics.orders={push_type: 1, max_deliveries: 0, ttl_s: 60, retain_consumed_s: 0}",
    )
    orders = config.mq.topic("orders")
    assert orders == TopicSettings(
        push_type=1,
        ack_timeout_s=30.0,
        max_deliveries=0,
        max_length=0,
        max_bytes=0,
        overflow="reject",
        ttl_s=60.0,
        retain_consumed_s=0.0,
    )
    assert config.mq.topic("orders.dlq").push_type == 2  # exact names only
    assert config.mq.topic("other").ack_timeout_s == 30.0


def test_empty_topic_override_is_allowed() -> None:
    config = load("mq.topics={orders: null, billing: {}}")
    assert config.mq.topics == {"orders": TopicOverride(), "billing": TopicOverride()}


# --- bad values -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("server.port=abc", "server.port: expected an integer between 0 and 65535, got 'abc'"),
        ("server.port=65536", "server.port: expected an integer between 0 and 65535, got 65536"),
        ("server.port=-1", "server.port: expected an integer between 0 and 65535, got -1"),
        ("server.port=true", "server.port: expected an integer between 0 and 65535, got true"),
        ("server.port=80.5", "server.port: expected an integer between 0 and 65535, got 80.5"),
        ("server.max_connections=0", "server.max_connections: expected an integer >= 1, got 0"),
        ("server.auth_timeout_s=0", "server.auth_timeout_s: expected a number > 0, got 0"),
        ("server.heartbeat_s=-1.5", "server.heartbeat_s: expected a number > 0, got -1.5"),
        ("server.long_poll_max_s=.inf", "server.long_poll_max_s: expected a number > 0, got inf"),
        ("server.max_batch=null", "server.max_batch: expected an integer >= 1, got null"),
        ("server.host=", "server.host: must not be empty"),
        ("mq.push_type=3", "mq.push_type: expected one of 1, 2, got 3"),
        ("mq.ack_timeout_s=0", "mq.ack_timeout_s: expected a number > 0, got 0"),
        ("mq.ack_timeout_s=soon", "mq.ack_timeout_s: expected a number > 0, got 'soon'"),
        ("mq.max_deliveries=-1", "mq.max_deliveries: expected an integer >= 0, got -1"),
        ("mq.prefetch=0", "mq.prefetch: expected an integer >= 1, got 0"),
        ("mq.max_length=1.5", "mq.max_length: expected an integer >= 0, got 1.5"),
        ("mq.overflow=block", "mq.overflow: expected one of 'reject', 'drop_oldest', got 'block'"),
        ("mq.expired=keep", "mq.expired: expected one of 'drop', 'dead_letter', got 'keep'"),
        ("mq.ttl_s=-1", "mq.ttl_s: expected a number >= 0, got -1"),
        ("mq.secret_key=[a]", None),  # a string key takes the text as it is: valid
        ("mq.topics.orders.push_type=0", "mq.topics.orders.push_type: expected one of 1, 2, got 0"),
        ("mq.topics.orders.ack_timeout_s=0", "mq.topics.orders.ack_timeout_s: expected a number > 0"),
        ("mq.topics.orders.overflow=x", "mq.topics.orders.overflow: expected one of 'reject'"),
        ("mq.topics.orders.max_lenght=1", "mq.topics.orders.max_lenght: unknown key; did you mean"),
        ("mq.topics=5", "mq.topics: expected a mapping of topic name to settings, got 5"),
        ("mq=3", "mq: expected a mapping, got 3"),
        ("mq.unknown=1", "mq.unknown: unknown key"),
        ("storage.fsync=sometimes", "storage.fsync: expected one of 'always', 'interval', 'never'"),
        ("storage.fsync_interval_ms=0", "storage.fsync_interval_ms: expected an integer >= 1, got 0"),
        ("storage.dir=[a]", None),
        ("cluster.enabled=1", "cluster.enabled: expected true or false, got 1"),
        ("cluster.enabled=maybe", "cluster.enabled: expected true or false, got 'maybe'"),
        ("cluster.bind=nohost", "cluster.bind: expected host:port"),
        ("cluster.bind=:8021", "cluster.bind: expected host:port"),
        ("cluster.bind=h:70000", "cluster.bind: expected host:port with a port between 0 and 65535"),
        ("cluster.bind=::1:8021", "cluster.bind: expected host:port"),
        ("cluster.advertise=h:0", "cluster.advertise: expected host:port with a port between 1 and 65535"),
        ("cluster.seeds=[a:1, b]", "cluster.seeds[1]: expected host:port"),
        ("cluster.seeds=[a:1, 2]", "cluster.seeds: expected a list of strings, got a list"),
        ("cluster.seeds={a: 1}", "cluster.seeds: expected a list of strings, got a dict"),
        ("cluster.profile=wan", "cluster.profile: expected one of 'lan', 'fast', got 'wan'"),
        ("cluster.secret=[a, '']", "cluster.secret: a key must not be empty"),
        ("cluster.secret={a: 1}", "cluster.secret: expected a list of strings"),
        ("cluster.tuning.probe_interval_s=0", "cluster.tuning.probe_interval_s: expected a number > 0"),
        ("cluster.tuning.gossip_nodes=0", "cluster.tuning.gossip_nodes: expected an integer >= 1"),
        ("cluster.tuning.probe_intervall_s=1", "cluster.tuning.probe_intervall_s: unknown key; did you mean"),
        ("replication.role=primary", "replication.role: expected one of 'master', 'slave'"),
        ("replication.mode=semi", "replication.mode: expected one of 'async', 'sync'"),
        ("replication.failover_timeout_s=0", "replication.failover_timeout_s: expected a number > 0"),
        ("replication.master=http://m:8011", "replication.master: only a slave names its master"),
        ("replication.sync_timeout_ms=0", "replication.sync_timeout_ms: expected an integer >= 1"),
        ("replication.backlog_bytes=1000", "replication.backlog_bytes: expected an integer >= 65536"),
        ("replication.give_back=maybe", "replication.give_back: expected true or false"),
        ("log.level=trace", "log.level: expected one of 'debug', 'info', 'warning', 'error', got 'trace'"),
        (
            "mq.max_message_bytes=100000000",
            "mq.max_message_bytes: expected an integer between 1 and 67108864",
        ),
    ],
)
def test_bad_values_name_the_key(override: str, expected: str | None) -> None:
    if expected is None:
        load(override)
        return
    assert error_of(override).startswith(expected)


def test_slave_needs_a_master_url() -> None:
    message = error_of("replication.role=slave")
    assert message.startswith("replication.master: expected an http(s) URL")
    assert "required when replication.role is slave" in message
    message = error_of("replication.role=slave", "replication.master=ws://m:8011")
    assert message.startswith("replication.master: expected an http(s) URL")
    config = load("replication.role=slave", "replication.master=https://10.0.0.1:8011")
    assert config.replication.master == "https://10.0.0.1:8011"
    assert error_of("replication.role=slave", "replication.master=http://127.0.0.1:8011").startswith(
        "replication.master: 'http://127.0.0.1:8011' is this node itself"
    )


@pytest.mark.parametrize(
    "url",
    ["10.0.0.1:8011", "ws://10.0.0.1:8011", "HTTP://h:1", "http://", "http://:8011", "http://h:99999",
     "http://h:port", "http://[::1", "https://h:8011/?x=1", "https://h:8011/#top"],
)  # fmt: skip
def test_public_url_must_be_an_http_url(url: str) -> None:
    message = error_of(f"server.public_url={url}")
    assert message.startswith("server.public_url: expected an http(s) URL such as https://10.0.0.1:8011")
    assert message.endswith(f"got {url!r}")


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.1:8011", "https://mq.internal", "http://[::1]:9011", "https://lb.internal:443/kapok/"],
)
def test_public_url_forms_that_load(url: str) -> None:
    assert load(f"server.public_url={url}").server.public_url == url
    assert load().server.public_url == ""  # empty: built from server.host and server.port


def test_good_host_port_forms() -> None:
    config = load("cluster.bind=[::1]:0", "cluster.seeds=[host.example:8021, '[fe80::1]:9', 10.0.0.1:1]")
    assert config.cluster.bind == "[::1]:0"
    assert len(config.cluster.seeds) == 3


@given(st.integers(min_value=0, max_value=65535))
def test_every_valid_port_loads(port: int) -> None:
    assert load(f"server.port={port}").server.port == port


@given(st.integers().filter(lambda n: not 0 <= n <= 65535))
def test_every_invalid_port_fails(port: int) -> None:
    assert error_of(f"server.port={port}").startswith("server.port: expected an integer between 0 and 65535")


# --- exposed nodes ----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "example.com", "192.168.1.1"])
@pytest.mark.parametrize("key", ["test", ""])
def test_exposed_node_refuses_default_or_empty_key(host: str, key: str) -> None:
    message = error_of(f"server.host={host}", f"mq.secret_key={key}")
    assert message.startswith("mq.secret_key: refusing to start")
    assert repr(host) in message and "not a loopback address" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1"])
def test_loopback_node_may_keep_test_key(host: str) -> None:
    assert load(f"server.host={host}").mq.secret_key == "test"


def test_exposed_node_with_real_key_starts() -> None:
    assert load("server.host=0.0.0.0", "mq.secret_key=s3cr3t-xyz").server.host == "0.0.0.0"


def test_wildcard_gossip_bind_needs_an_advertised_address() -> None:
    message = error_of("cluster.enabled=true", "cluster.bind=0.0.0.0:8021", "cluster.secret=k")
    assert message.startswith("cluster.advertise: required when cluster.bind is a wildcard address")
    sets: tuple[str, ...] = ("cluster.enabled=true", "cluster.bind=[::]:8021", "cluster.secret=k")
    sets += ("cluster.advertise=10.0.0.1:8021",)
    assert load(*sets).cluster.advertise == "10.0.0.1:8021"


def test_exposed_gossip_needs_a_cluster_secret() -> None:
    message = error_of("cluster.enabled=true", "cluster.bind=10.0.0.1:8021")
    assert message.startswith("cluster.secret: refusing to start")
    assert load("cluster.enabled=true", "cluster.bind=10.0.0.1:8021", "cluster.secret=k").cluster.enabled
    assert load("cluster.enabled=true").cluster.secret == ()  # loopback gossip: fine


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("kapok.local")


# --- configs built in code --------------------------------------------------------------


def test_validate_config_checks_configs_built_in_code() -> None:
    validate_config(Config.default())
    with pytest.raises(ConfigError, match=r"^server\.port: expected an integer"):
        validate_config(Config(server=ServerConfig(port=70000)))
    with pytest.raises(ConfigError, match=r"^cluster\.seeds\[0\]: expected host:port"):
        validate_config(Config(cluster=ClusterConfig(seeds=("nope",))))
    with pytest.raises(ConfigError, match=r"^mq\.topics\.t\.overflow: expected one of"):
        validate_config(Config(mq=MqConfig(topics=FrozenMap({"t": TopicOverride(overflow="no")}))))


# --- documentation ----------------------------------------------------------------------

KAPOKMQ_KEYS = [
    "server.addr",
    "server.port",
    "mq.secretKey",
    "mq.pushType",
    "mq.messageChanBuffer",
    "mq.pushMessagesSpeed",
    "mq.pushCount",
    "mq.pushRetryTime",
    "mq.persistentFile",
    "mq.isPersistent",
    "mq.recoveryStrategy",
    "mq.persistentTime",
    "mq.isCleanConsumed",
    "mq.isRePush",
    "mq.isClean",
    "mq.checkSpeed",
    "mq.cleanTime",
    "cluster.isCluster",
    "cluster.gossipPort",
    "cluster.registryAddr",
    "cluster.registryGossipPort",
    "sync.isSync",
    "sync.isSlave",
    "sync.masterProtocol",
    "sync.masterAddr",
    "sync.masterPort",
]


def test_docs_list_every_key_and_every_kapokmq_key() -> None:
    docs = (REPO_ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    kapokmq = (REPO_ROOT / "docs" / "kapokmq.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in docs.splitlines() if line.startswith("| `")}
    kapokmq_rows = {line.split("|")[1].strip() for line in kapokmq.splitlines() if line.startswith("| `")}
    assert {f"`{path}`" for path in EXPECTED_DEFAULTS} <= rows
    assert {f"`{key}`" for key in KAPOKMQ_KEYS} <= kapokmq_rows
    for name in dataclasses.fields(TopicOverride):
        assert f"`{name.name}`" in docs


def test_cluster_secret_is_a_key_ring_and_tuning_overrides_the_profile() -> None:
    assert load("cluster.secret=new,old").cluster.secret == ("new", "old")
    assert load("cluster.secret=only").cluster.secret == ("only",)
    cluster = load("cluster.profile=fast", "cluster.tuning.probe_interval_s=0.3").cluster
    swim = swim_config(cluster)
    assert swim.probe_interval_s == 0.3
    assert swim.probe_timeout_s == SwimConfig.profile("fast").probe_timeout_s
    assert swim_config(Config.default().cluster) == SwimConfig.profile("lan")


def test_tuning_that_breaks_a_protocol_rule_is_a_config_error() -> None:
    cluster = load("cluster.tuning.probe_timeout_s=5").cluster
    with pytest.raises(ConfigError, match=r"^cluster\.tuning: probe_timeout_s must not exceed"):
        swim_config(cluster)


def test_every_tuning_key_is_a_protocol_timing() -> None:
    tunable = [f.name for f in dataclasses.fields(SwimConfig) if f.metadata.get("tunable", True)]
    assert [f.name for f in dataclasses.fields(GossipTuning)] == tunable
    swim_types, tuning_types = typing.get_type_hints(SwimConfig), typing.get_type_hints(GossipTuning)
    assert all(tuning_types[name] == swim_types[name] | None for name in tunable)


def test_every_tuning_key_reaches_the_protocol() -> None:
    # The fast profile with every tunable timing set to lan's, by environment variable, is lan.
    lan = SwimConfig.profile("lan")
    names = [f.name for f in dataclasses.fields(GossipTuning)]
    env = {env_var_name(f"cluster.tuning.{name}"): str(getattr(lan, name)) for name in names}
    assert swim_config(load("cluster.profile=fast", env=env).cluster) == lan


@dataclasses.dataclass(frozen=True, slots=True)
class _NewerSwimConfig(SwimConfig):
    """SwimConfig as it would be with four more fields."""

    settle_s: float = dataclasses.field(default=2.0, metadata={"gt": 0})
    fanout_cap: int = 4  # no bounds of its own: non-negative, as every SwimConfig number
    quiet: bool = False
    wire_limit: int = dataclasses.field(default=9, metadata={"tunable": False})


@dataclasses.dataclass(frozen=True, slots=True)
@_overrides_of(_NewerSwimConfig)
class _NewerTuning:
    """GossipTuning as it would be, with not a line of it changed."""


def test_a_new_protocol_field_is_a_tuning_key_without_editing_the_config_package() -> None:
    def tuning(**values: object) -> _NewerTuning:
        return build(_NewerTuning, values, "cluster.tuning.")

    names = [f.name for f in dataclasses.fields(_NewerTuning)]
    assert names == [*(f.name for f in dataclasses.fields(GossipTuning)), "settle_s", "fanout_cap", "quiet"]
    got = dataclasses.asdict(tuning(settle_s=0.5, fanout_cap=0, quiet=True, probe_interval_s=2))
    assert (got["settle_s"], got["fanout_cap"], got["quiet"], got["probe_interval_s"]) == (0.5, 0, True, 2.0)
    assert set(dataclasses.asdict(tuning()).values()) == {None}
    cases: list[tuple[dict[str, object], str]] = [
        ({"settle_s": 0}, "cluster.tuning.settle_s: expected a number > 0, got 0"),
        ({"fanout_cap": -1}, "cluster.tuning.fanout_cap: expected an integer >= 0, got -1"),
        ({"fanout_cap": 1.5}, "cluster.tuning.fanout_cap: expected an integer >= 0, got 1.5"),
        ({"quiet": 1}, "cluster.tuning.quiet: expected true or false, got 1"),
        ({"setle_s": 1}, "cluster.tuning.setle_s: unknown key; did you mean 'settle_s'?"),
        ({"gossip_nodes": 0}, "cluster.tuning.gossip_nodes: expected an integer >= 1, got 0"),
    ]
    for values, expected in cases:
        with pytest.raises(ConfigError) as caught:
            tuning(**values)
        assert caught.value.message == expected
    with pytest.raises(ConfigError, match=r"^cluster\.tuning\.wire_limit: unknown key"):
        tuning(wire_limit=9)  # marked tunable: False in the protocol's class


def test_public_dict_hides_every_secret() -> None:
    cfg = load_config(None, overrides=["mq.secret_key=s3cr3t", "cluster.secret=[k1, k2]"], env={})
    shown = public_dict(cfg)
    assert shown["mq"]["secret_key"] == "(hidden)" and shown["cluster"]["secret"] == "(hidden)"
    assert "s3cr3t" not in repr(shown) and "k1" not in repr(shown)
    assert shown["server"] == cfg.to_dict()["server"]  # everything else as it is
