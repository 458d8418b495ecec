"""The configuration's schema: one frozen dataclass per section, and ``Config`` of them.

A field's default is the key's default; its metadata (``_opt``) bounds the value
(``lo``, ``hi``, ``gt``, ``choices``), which ``kapok.config.convert`` checks, and ``_secret``
marks a value that is never shown (``public_dict``). Adding a key means adding one field
here, one line in ``application.yaml`` and one row in ``docs/config.md``.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kapok.cluster.config import SwimConfig
from kapok.core.settings import BrokerSettings, TopicSettings

__all__ = [
    "DEFAULT_SECRET_KEY",
    "ENV_PREFIX",
    "ClusterConfig",
    "Config",
    "ConsoleConfig",
    "FrozenMap",
    "GossipTuning",
    "LogConfig",
    "MetricsConfig",
    "MqConfig",
    "ReplicationConfig",
    "ServerConfig",
    "StorageConfig",
    "TopicOverride",
    "env_var_name",
    "public_dict",
    "usable_memory_bytes",
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
    heartbeat_s: float = _opt(30.0, gt=0)  # a WebSocket client silent this long is pinged
    busy_poll_us: int = _opt(200, lo=0, hi=100_000)  # µs the loop polls after a client's data (0 = never)
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
    public_url: str = ""  # http(s) URL clients are told to reach this node at; "" = from host and port

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
    min_free_bytes: int = _opt(64 * _MIB, lo=0)  # less free space on storage.dir: publishes get storage_full


def _overrides_of(protocol: type[Any]) -> Callable[[type[T]], type[T]]:
    """A class decorator that gives its class one field per field of dataclass ``protocol``
    that a configuration may set (all but those whose metadata says ``tunable: False``):
    of the same type or None, None by default, bounded as the metadata says (``gt``,
    ``lo``, ``hi``) or else non-negative, as every number of ``SwimConfig`` is."""

    def add_fields(cls: type[T]) -> type[T]:
        hints = typing.get_type_hints(protocol)
        annotations: dict[str, object] = {}
        for f in dataclasses.fields(protocol):
            if not f.metadata.get("tunable", True):
                continue
            tp = hints[f.name]
            bounds = {k: v for k, v in f.metadata.items() if k in ("lo", "hi", "gt")}
            if not bounds and tp is not bool:
                bounds = {"lo": 0}
            annotations[f.name] = tp | None
            setattr(cls, f.name, field(default=None, metadata=bounds))
        cls.__annotations__ = annotations
        return cls

    return add_fields


@dataclass(frozen=True, slots=True)
@_overrides_of(SwimConfig)
class GossipTuning:
    """Overrides of the ``cluster.profile`` timings; None = the profile's value.

    Its fields are those of ``kapok.cluster.config.SwimConfig`` that are not fixed there, so
    a new protocol timing is a key here without a line in this package; SwimConfig
    documents each one and checks the rules across them (``swim_config`` builds it when
    the node starts)."""


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
class MetricsConfig:
    require_key: bool = False  # /metrics needs the secret key (Prometheus: a bearer token)
    max_topics: int = _opt(1000, lo=0)  # topics with series of their own; the rest are summed as one


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
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @classmethod
    def default(cls) -> Config:
        return cls()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts and lists, as ``application.yaml`` would spell them."""
        return typing.cast("dict[str, Any]", _plain(self))


def env_var_name(path: str) -> str:
    """``mq.secret_key`` -> ``KAPOK_MQ_SECRET_KEY``."""
    return ENV_PREFIX + path.upper().replace(".", "_")


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
