"""Kapok's configuration: one frozen dataclass tree and its loader.

Layers, later ones win: the defaults below <- ``application.yaml`` <- environment
variables ``KAPOK_<SECTION>_<KEY>`` <- ``--set section.key=value`` arguments.
Override values are parsed as YAML (``[a, b]`` is a list, ``true`` a boolean).

The loader is driven by the dataclass field types and a little metadata (ranges and
choices), so adding a key means adding one field here, one line in ``application.yaml``
and one row in ``docs/config.md``. Every problem is a ``ConfigError`` whose message
starts with the full key path, e.g. ``server.port: expected an integer between 0 and
65535, got 'abc'``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
import logging
import math
import os
import types
import typing
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from kapok.config.kapokmq import Note, annotate, is_kapokmq, translate
from kapok.core.settings import BrokerSettings, TopicSettings
from kapok.errors import ConfigError

__all__ = [
    "ClusterConfig",
    "Config",
    "ConsoleConfig",
    "FrozenMap",
    "GossipTuning",
    "LogConfig",
    "MqConfig",
    "ReplicationConfig",
    "ServerConfig",
    "StorageConfig",
    "TopicOverride",
    "env_var_name",
    "is_loopback",
    "load_config",
    "public_dict",
    "read_config_file",
    "usable_memory_bytes",
    "validate_config",
]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

ENV_PREFIX = "KAPOK_"
DEFAULT_SECRET_KEY = "test"
_MIB = 1024 * 1024


class FrozenMap(Mapping[K, V]):
    """A read-only, hashable mapping, so that a frozen ``Config`` stays hashable."""

    __slots__ = ("_data", "_hash")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._data: dict[K, V] = dict(items)
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def _opt(
    default: T,
    *,
    lo: float | None = None,
    hi: float | None = None,
    gt: float | None = None,
    choices: tuple[object, ...] | None = None,
) -> T:
    """A field default plus its constraints: ``lo <= v <= hi``, ``v > gt``, ``v in choices``."""
    meta = {"lo": lo, "hi": hi, "gt": gt, "choices": choices}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def _secret(default: T) -> T:
    """A field whose value is never shown (the console's effective config, ``public_dict``)."""
    return field(default=default, metadata={"secret": True})


# Constraints shared by an mq default and its per-topic override.
_PUSH_TYPES = (1, 2)
_OVERFLOW = ("reject", "drop_oldest")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"  # HTTP/WebSocket bind address
    port: int = _opt(8011, lo=0, hi=65535)  # HTTP/WebSocket port (0 = any free port)
    name: str = ""  # node name; empty = "<host>:<port>"
    max_connections: int = _opt(10000, lo=1)  # open client connections, all kinds
    auth_timeout_s: float = _opt(10.0, gt=0)  # seconds to complete the WebSocket secret-key handshake
    auth_max_attempts: int = _opt(3, lo=1)  # wrong keys before the connection is closed
    heartbeat_s: float = _opt(30.0, gt=0)  # seconds between WebSocket pings
    send_queue_max_bytes: int = _opt(16 * _MIB, lo=1)  # bytes queued to a connection before its reads pause
    long_poll_max_s: float = _opt(60.0, gt=0)  # longest `wait` of an HTTP pull, seconds
    max_batch: int = _opt(1000, lo=1)  # messages per pub frame / HTTP batch
    header_timeout_s: float = _opt(10.0, gt=0)  # seconds from accept or the last answer to the headers
    body_timeout_s: float = _opt(30.0, gt=0)  # seconds to receive a request's whole body
    idle_timeout_s: float = _opt(75.0, gt=0)  # a kept-alive connection that showed the key waits this long
    auth_backoff_after: int = _opt(10, lo=1)  # wrong keys from one address before it must wait
    auth_backoff_s: float = _opt(1.0, gt=0)  # first wait of such an address; doubles per wrong key
    auth_backoff_max_s: float = _opt(300.0, gt=0)  # longest wait of such an address
    tls_cert: str = ""  # PEM certificate chain: serve HTTPS and WSS (with tls_key)
    tls_key: str = ""  # PEM private key of tls_cert

    @property
    def node_name(self) -> str:
        """``name`` if set, else ``host:port`` (IPv6 hosts in brackets)."""
        if self.name:
            return self.name
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TopicOverride:
    """Per-topic settings from ``mq.topics.<name>``; None = inherit the mq default."""

    push_type: int | None = _opt(None, choices=_PUSH_TYPES)  # 1 = p2p, 2 = pub/sub
    ack_timeout_s: float | None = _opt(None, gt=0)  # seconds before an unacked delivery is retried
    max_deliveries: int | None = _opt(None, lo=0)  # attempts before dead-lettering, 0 = unlimited
    max_length: int | None = _opt(None, lo=0)  # messages held, 0 = unlimited
    max_bytes: int | None = _opt(None, lo=0)  # payload bytes held, 0 = unlimited
    overflow: str | None = _opt(None, choices=_OVERFLOW)  # what a full topic does
    ttl_s: float | None = _opt(None, lo=0)  # default message TTL, seconds, 0 = none
    retain_consumed_s: float | None = _opt(None, lo=0)  # seconds a consumed message is kept


@dataclass(frozen=True, slots=True)
class MqConfig:
    secret_key: str = _secret(DEFAULT_SECRET_KEY)  # shared key for producers, consumers, console and sync
    push_type: int = _opt(1, choices=_PUSH_TYPES)  # default topic mode: 1 = p2p, 2 = pub/sub
    ack_timeout_s: float = _opt(60.0, gt=0)  # seconds before an unacked delivery is retried
    max_deliveries: int = _opt(5, lo=0)  # attempts before dead-lettering to <topic>.dlq, 0 = unlimited
    prefetch: int = _opt(100, lo=1)  # default unacked messages out to one consumer
    max_prefetch: int = _opt(10_000, lo=1, hi=1_000_000)  # a consumer asking for more gets this many
    max_backlog_bytes: int = _opt(0, lo=0)  # node-wide live payload + 512 B/message; 0 = RAM / 4
    max_message_bytes: int = _opt(1048576, lo=1, hi=64 * _MIB)  # largest payload accepted, bytes
    dedup_window_s: float = _opt(86400.0, gt=0)  # seconds a dedup_id is remembered
    dedup_max_entries: int = _opt(1_000_000, lo=1)  # dedup ids remembered at most (oldest evicted)
    max_length: int = _opt(0, lo=0)  # messages held per topic, 0 = unlimited
    max_bytes: int = _opt(0, lo=0)  # payload bytes held per topic, 0 = unlimited
    overflow: str = _opt("reject", choices=_OVERFLOW)  # full topic: reject the producer or drop oldest
    ttl_s: float = _opt(0.0, lo=0)  # default message TTL, seconds, 0 = none
    expired: str = _opt("drop", choices=("drop", "dead_letter"))  # fate of an expired message
    retain_consumed_s: float = _opt(3600.0, lo=0)  # seconds a consumed message stays inspectable
    retain_consumed_max: int = _opt(100_000, lo=0)  # consumed messages kept at most (whole node)
    producer_rate: float = _opt(0.0, lo=0)  # messages/s per producer, 0 = unlimited
    producer_burst: int = _opt(1000, lo=1)  # token-bucket size of that limit, messages
    topics: Mapping[str, TopicOverride] = field(default_factory=FrozenMap)  # per-topic overrides

    def topic(self, name: str) -> TopicSettings:
        """The effective settings of topic ``name`` (exact name match, no patterns)."""
        over = self.topics.get(name, _NO_OVERRIDE)
        values = {
            f.name: getattr(self, f.name) if getattr(over, f.name) is None else getattr(over, f.name)
            for f in dataclasses.fields(TopicOverride)
        }
        return TopicSettings(**values)

    def settings(self) -> BrokerSettings:
        """What the broker core reads of this section."""
        return BrokerSettings(
            topic_defaults=self.topic(""),
            prefetch=self.prefetch,
            max_prefetch=self.max_prefetch,
            max_backlog_bytes=self.backlog_limit(),
            max_message_bytes=self.max_message_bytes,
            dedup_window_s=self.dedup_window_s,
            dedup_max_entries=self.dedup_max_entries,
            expired=self.expired,
            retain_consumed_max=self.retain_consumed_max,
            producer_rate=self.producer_rate,
            producer_burst=self.producer_burst,
            topic_overrides={name: self.topic(name) for name in self.topics},
        )

    def backlog_limit(self) -> int:
        """``max_backlog_bytes``, or when 0 a quarter of the memory this process may use."""
        return self.max_backlog_bytes or usable_memory_bytes() // 4


def usable_memory_bytes() -> int:
    """The machine's memory, or the cgroup's limit when a container sets a lower one."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        import psutil  # here, not at the top: this module stays free of I/O imports

        total = int(psutil.virtual_memory().total)
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()  # cgroup v2
    except OSError:
        return total
    return min(total, int(text)) if text.isdigit() else total


_NO_OVERRIDE = TopicOverride()


@dataclass(frozen=True, slots=True)
class StorageConfig:
    dir: str = "./data"  # data directory: WAL segments, snapshots, archive
    fsync: str = _opt("always", choices=("always", "interval", "never"))  # when the WAL is fsynced
    fsync_interval_ms: int = _opt(10, lo=1)  # period of fsync = interval, milliseconds
    snapshot_interval_s: float = _opt(60.0, gt=0)  # seconds between snapshots
    segment_max_bytes: int = _opt(64 * _MIB, lo=4096)  # WAL segment size before a new file is started
    archive: bool = True  # write message lifecycle events for analytics under <dir>/archive
    archive_rotate_bytes: int = _opt(64 * _MIB, lo=4096)  # archive file size before rotation
    archive_max_bytes: int = _opt(1024 * _MIB, lo=4096)  # archive files kept at most, bytes in total
    archive_max_age_s: float = _opt(7 * 86400.0, gt=0)  # archive files older than this are deleted


@dataclass(frozen=True, slots=True)
class GossipTuning:
    """Overrides of the ``cluster.profile`` timings; None = the profile's value.

    The names are those of ``kapok.cluster.config.SwimConfig``, which documents each one
    and checks the rules across them (``swim_config`` builds it when the node starts)."""

    probe_interval_s: float | None = _opt(None, gt=0)  # one probe per interval
    probe_timeout_s: float | None = _opt(None, gt=0)  # wait for a direct ack before indirect probes
    indirect_checks: int | None = _opt(None, lo=0)  # members asked to probe on our behalf
    suspicion_mult: int | None = _opt(None, lo=1)  # suspicion timeout = mult × log10(n) × probe interval
    suspicion_max_timeout_mult: int | None = _opt(None, lo=1)  # longest suspicion = this × shortest
    awareness_max_multiplier: int | None = _opt(None, lo=1)  # local health slows probing at most this much
    gossip_interval_s: float | None = _opt(None, gt=0)  # gossip tick while updates are queued
    gossip_nodes: int | None = _opt(None, lo=1)  # members gossiped to per tick
    gossip_to_dead_s: float | None = _opt(None, lo=0)  # dead members still get gossip this long
    retransmit_mult: int | None = _opt(None, lo=1)  # each update is sent mult × log10(n + 1) times
    push_pull_interval_s: float | None = _opt(None, gt=0)  # full state exchange period (TCP)
    dead_reclaim_s: float | None = _opt(None, lo=0)  # a dead name may come back from a new address after
    forget_dead_s: float | None = _opt(None, lo=0)  # dead and left members are dropped after
    join_retry_s: float | None = _opt(None, gt=0)  # join re-sent this often while alone
    reconnect_interval_s: float | None = _opt(None, gt=0)  # state exchange with a dead member this often


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    enabled: bool = False  # join the SWIM gossip cluster
    bind: str = "127.0.0.1:8021"  # gossip address, host:port (UDP, and TCP for state exchange)
    advertise: str = ""  # host:port others reach us at; empty = bind
    seeds: tuple[str, ...] = ()  # host:port gossip addresses to join through
    secret: tuple[str, ...] = _secret(())  # gossip HMAC keys: the first signs, all are accepted (rotation)
    profile: str = _opt("lan", choices=("lan", "fast"))  # timing profile: lan, or fast (tests, demos)
    tuning: GossipTuning = field(default_factory=GossipTuning)  # per-timing overrides of the profile


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    role: str = _opt("master", choices=("master", "slave"))  # this node's role in its pair
    master: str = ""  # http(s) URL of the master (a slave's only, and required there)
    mode: str = _opt("sync", choices=("async", "sync"))  # sync = a producer's ack waits for the slave
    failover_timeout_s: float = _opt(3.0, gt=0)  # seconds of silence (link and gossip) before a takeover
    sync_timeout_ms: int = _opt(1000, lo=1)  # sync: how long a producer's ack may wait for the slave
    backlog_bytes: int = _opt(64 * _MIB, lo=64 * 1024)  # the master's in-memory log for resuming slaves
    give_back: bool = True  # a returning master takes its role back once caught up


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    enabled: bool = True  # serve the web console at / and /console/
    session_idle_s: float = _opt(8 * 3600.0, gt=0)  # a console login ends after this long unused
    refresh_s: float = _opt(5.0, gt=0)  # default refresh period of the console's live figures
    analytics_dir: str = ""  # where the analytics job's summary.json is; empty = <storage.dir>/analytics


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = _opt("info", choices=("debug", "info", "warning", "error"))  # least severe level logged
    format: str = _opt("human", choices=("human", "json"))  # one readable line, or one JSON object per line
    file: str = ""  # log to this file, rotated by size; empty = standard error
    max_bytes: int = _opt(64 * _MIB, lo=0)  # rotate the file when it would grow past this, 0 = never
    backups: int = _opt(5, lo=1)  # rotated files kept: FILE.1 (newest) ... FILE.<backups>


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    mq: MqConfig = field(default_factory=MqConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @classmethod
    def default(cls) -> Config:
        return cls()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists, as ``application.yaml`` would spell them."""
        return typing.cast("dict[str, Any]", _plain(self))


# ---------------------------------------------------------------------------------------
# Loading


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    notes: list[Note] | None = None,
) -> Config:
    """Defaults <- YAML file ``path`` <- ``KAPOK_*`` variables of ``env`` (default
    ``os.environ``) <- ``overrides`` (``"section.key=value"``); then validated.

    A KapokMQ file is translated (``kapok.config.kapokmq``); what became of each of its
    keys is appended to ``notes``, for the caller to log."""
    raw: dict[str, Any] = {} if path is None else read_config_file(Path(path), notes)
    for name, value in _env_overrides(os.environ if env is None else env):
        _merge(raw, _nest(name, value))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected path=value, e.g. server.port=8011")
        _merge(raw, _nest(key, _parse_value(key, text, f"--set {key}")))
    config = _build(Config, raw, "")
    validate_config(config)
    return config


def read_config_file(path: Path, notes: list[Note] | None = None) -> dict[str, Any]:
    """The mapping of a Kapok file, or the translation of a KapokMQ file (its notes
    appended to ``notes``); a value of the translation that Kapok refuses is reported
    under the KapokMQ key it came from."""
    raw = _read_yaml_file(path)
    if not is_kapokmq(raw):
        return raw
    translation = translate(raw)
    try:
        _build(Config, translation.raw, "")
    except ConfigError as exc:
        raise annotate(exc, translation.origin) from None
    if notes is not None:
        notes.append(
            Note("", logging.INFO, f"{path} is a KapokMQ configuration: its keys are translated "
                 f"(`kapok config convert {path}` prints the Kapok file)")
        )  # fmt: skip
        notes.extend(translation.notes)
    return translation.raw


def convert_kapokmq_file(path: Path) -> str:
    """``kapok config convert``: the Kapok file equivalent to KapokMQ file ``path``, each
    key's fate as a comment on top. A file that is not KapokMQ's, or whose translation
    Kapok would refuse, is a ``ConfigError``."""
    notes: list[Note] = []
    raw = read_config_file(path, notes)
    if not notes:
        raise ConfigError(f"{path}: not a KapokMQ configuration (no KapokMQ key); see `kapok check`")
    load_config(path, env={})  # the rules across keys, as `kapok serve` would apply them
    header = [
        f"# Kapok configuration converted from KapokMQ's {path.name} by `kapok config convert`.",
        "# What became of each KapokMQ key:",
        *(f"#   {note.text}" for note in notes if note.key),
    ]
    body = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(header) + "\n\n" + body


def env_var_name(path: str) -> str:
    """``mq.secret_key`` -> ``KAPOK_MQ_SECRET_KEY``."""
    return ENV_PREFIX + path.upper().replace(".", "_")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: as safe as safe_load
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {_show(data)}")
    return data


@functools.cache
def _leaf_paths() -> dict[str, object]:
    """Every settable path (``mq.topics`` counts as one) and its type."""
    out: dict[str, object] = {}

    def walk(cls: type[Any], prefix: str) -> None:
        for name, tp in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(tp):
                walk(typing.cast("type[Any]", tp), f"{prefix}{name}.")
            else:
                out[prefix + name] = tp

    walk(Config, "")
    return out


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, object]]:
    """``KAPOK_<SECTION>_<KEY>`` variables as (path, value). A ``KAPOK_`` variable that
    does not start with a section name (``KAPOK_HOME``...) is not config and is ignored;
    one that does but names no key is a typo and an error."""
    by_env = {env_var_name(p): p for p in _leaf_paths()}
    sections = tuple(env_var_name(f.name) + "_" for f in dataclasses.fields(Config))
    found: list[tuple[str, object]] = []
    unknown: list[str] = []
    for var in sorted(env):
        if var in by_env:
            found.append((by_env[var], _parse_value(by_env[var], env[var], var)))
        elif var.startswith(sections):
            close = difflib.get_close_matches(var, by_env, n=1)
            unknown.append(var + (f" (did you mean {close[0]}?)" if close else ""))
    if unknown:
        hint = ""
        if any(v.startswith("KAPOK_MQ_TOPICS_") for v in unknown):
            hint = "; per-topic settings go in one variable: KAPOK_MQ_TOPICS='{orders: {max_length: 10}}'"
        raise ConfigError(f"unknown configuration environment variable(s): {', '.join(unknown)}{hint}")
    return found


def _parse_value(path: str, text: str, source: str) -> object:
    """Parse an override as YAML. A string-typed key takes the text as it is unless YAML
    reads it as a string (``'quoted'``), so ``KAPOK_MQ_SECRET_KEY=12345`` and
    ``--set server.host=::`` just work."""
    as_str = _leaf_paths().get(path) is str
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        if as_str:
            return text.strip()
        raise ConfigError(f"{source}: value is not valid YAML: {_yaml_problem(exc)}") from None
    if as_str and not isinstance(value, str):
        return text.strip()
    return value


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _nest(path: str, value: object) -> dict[str, Any]:
    """``a.b.c`` -> ``{a: {b: {c: value}}}``. Topic names may contain dots: in
    ``mq.topics.orders.eu.max_length`` the last part is the key if it is a known topic
    setting (or the value is not a mapping), and everything between is the topic name."""
    parts = path.split(".")
    if parts[:2] == ["mq", "topics"] and len(parts) > 3:
        known = {f.name for f in dataclasses.fields(TopicOverride)}
        if parts[-1] in known or not isinstance(value, dict):
            parts = [*parts[:2], ".".join(parts[2:-1]), parts[-1]]
        else:
            parts = [*parts[:2], ".".join(parts[2:])]
    out: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        out = {part: out}
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _build(cls: type[T], data: object, path: str) -> T:
    """Make dataclass ``cls`` from a mapping, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(fields)})"
            raise ConfigError(f"{path}{key}: unknown key{hint}")
    values = {
        name: _convert(data[name], hints[name], dict(f.metadata), f"{path}{name}")
        for name, f in fields.items()
        if name in data
    }
    return cls(**values)


def _convert(value: object, tp: Any, meta: dict[str, Any], path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast("type[Any]", tp), {} if value is None else value, path + ".")
    if origin is types.UnionType:  # ``X | None``: only TopicOverride has these
        return None if value is None else _convert(value, args[0], meta, path)
    if origin is Mapping:  # mq.topics: {name: TopicOverride}
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping of topic name to settings, got {_show(value)}")
        for name in value:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{path}: topic names must be non-empty strings, got {_show(name)}")
        items = ((n, _build(args[1], {} if v is None else v, f"{path}.{n}.")) for n, v in value.items())
        return FrozenMap(items)
    if origin is tuple:  # a list of strings; "a, b" is accepted too (handy in env variables)
        if value is None:  # `seeds:` with nothing after it
            value = []
        if isinstance(value, str):
            value = [s.strip() for s in value.split(",") if s.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings, got {_show(value)}")
        return tuple(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_show(value)}")
        return _check_choice(value, meta, path)
    if tp is int or tp is float:
        number: int | float | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value if tp is int else float(value)
        elif tp is float and isinstance(value, float) and math.isfinite(value):
            number = value
        if number is None or not _in_range(number, meta):
            noun = "an integer" if tp is int else "a number"
            raise ConfigError(f"{path}: expected {noun}{_range_text(meta)}, got {_show(value)}")
        return _check_choice(number, meta, path)
    raise TypeError(f"{path}: unsupported config field type {tp!r}")  # a bug in this module


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
    return (lo is None or value >= lo) and (hi is None or value <= hi) and (gt is None or value > gt)


def _range_text(meta: Mapping[str, Any]) -> str:
    lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if gt is not None:
        return f" > {gt}"
    return "" if lo is None else f" >= {lo}"


def _check_choice(value: object, meta: Mapping[str, Any], path: str) -> Any:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{path}: expected one of {', '.join(map(_show, choices))}, got {_show(value)}")
    return value


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return f"a {type(value).__name__} ({value!r})"
    return repr(value)


def public_dict(config: Config) -> dict[str, Any]:
    """``to_dict`` with every secret field (``mq.secret_key``, ``cluster.secret``) masked."""

    def walk(obj: object) -> object:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {
                f.name: "(hidden)" if f.metadata.get("secret") else walk(getattr(obj, f.name))
                for f in dataclasses.fields(obj)
            }
        return _plain(obj)

    return typing.cast("dict[str, Any]", walk(config))


def _plain(obj: object) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return list(obj)
    return obj


# ---------------------------------------------------------------------------------------
# Rules across keys


def validate_config(config: Config) -> None:
    """Check every value of a ``Config`` (also one built in code) and the rules that
    span keys; raise ``ConfigError`` on the first problem."""
    _build(Config, config.to_dict(), "")
    server, mq, cluster, repl = config.server, config.mq, config.cluster, config.replication
    if not server.host:
        raise ConfigError("server.host: must not be empty")
    if bool(server.tls_cert) != bool(server.tls_key):
        raise ConfigError("server.tls_cert: set both server.tls_cert and server.tls_key, or neither")
    if mq.prefetch > mq.max_prefetch:
        raise ConfigError(f"mq.prefetch: must not be above mq.max_prefetch ({mq.max_prefetch})")
    _check_host_port(cluster.bind, "cluster.bind", min_port=0)
    if cluster.advertise:
        _check_host_port(cluster.advertise, "cluster.advertise", min_port=1)
    for i, seed in enumerate(cluster.seeds):
        _check_host_port(seed, f"cluster.seeds[{i}]", min_port=1)
    if repl.master and repl.role == "master":
        raise ConfigError(
            "replication.master: only a slave names its master; remove it, or set replication.role: slave"
        )
    if repl.role == "slave":
        url = urlsplit(repl.master)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                "replication.master: expected an http(s) URL such as http://10.0.0.1:8011 "
                f"(required when replication.role is slave), got {repl.master!r}"
            )
        if is_loopback(url.hostname) and is_loopback(server.host) and url.port == server.port:
            raise ConfigError(f"replication.master: {repl.master!r} is this node itself (server.port)")
    if not is_loopback(server.host) and mq.secret_key in ("", DEFAULT_SECRET_KEY):
        which = "empty" if not mq.secret_key else f"the default {mq.secret_key!r}"
        raise ConfigError(
            f"mq.secret_key: refusing to start: server.host {server.host!r} is not a loopback "
            f"address and the secret key is {which}; "
            f"set mq.secret_key (or {env_var_name('mq.secret_key')}) to a real secret"
        )
    if any(not key for key in cluster.secret):
        raise ConfigError("cluster.secret: a key must not be empty")
    if cluster.enabled and not cluster.advertise and cluster.bind.rpartition(":")[0] in ("0.0.0.0", "[::]"):
        raise ConfigError(
            f"cluster.advertise: required when cluster.bind is a wildcard address ({cluster.bind!r}): "
            "set the host:port the other nodes reach this one at"
        )
    if cluster.enabled and not cluster.secret and not is_loopback(cluster.bind.rpartition(":")[0]):
        raise ConfigError(
            f"cluster.secret: refusing to start: cluster.bind {cluster.bind!r} is not a loopback "
            "address and the gossip secret is empty; set cluster.secret"
        )


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (brackets allowed)."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_host_port(value: str, path: str, *, min_port: int) -> None:
    host, sep, port = value.rpartition(":")
    bare = host.strip("[]")
    ok = bool(sep and bare and port.isdigit() and min_port <= int(port) <= 65535)
    if ok and ":" in bare and not (host.startswith("[") and host.endswith("]")):
        ok = False  # an IPv6 address must be written [addr]:port
    if not ok:
        raise ConfigError(
            f"{path}: expected host:port with a port between {min_port} and 65535, got {value!r}"
        )
