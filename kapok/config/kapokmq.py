"""KapokMQ's ``application.yaml``, read as a Kapok configuration.

A KapokMQ file is recognised by its keys: ``server.addr``, the camelCase keys of ``mq``
and ``cluster``, a ``sync`` or ``registry`` section (Kapok has none of them). ``translate``
turns it into the mapping a Kapok file would hold, by the key table of
docs/kapokmq.md, and says for every KapokMQ key what it became or why it is ignored (``Note``);
the node logs those lines at start-up and ``kapok config convert`` prints the result as a
Kapok file. Keys that are Kapok's own pass through, so a KapokMQ file may be extended with
Kapok keys (``log: {format: json}``) while a site migrates.

KapokMQ's flags are the integers 0 and 1 (booleans are accepted too) and its ports may be
strings; a value of the wrong shape is one ``ConfigError`` naming the KapokMQ key. Rules
across keys (a slave's master URL, the gossip address from ``server.addr``) are here; the
values themselves are checked by ``kapok.config`` like any other, and an error there names
the KapokMQ key it came from (``ConfigError`` of ``annotate``).
"""

from __future__ import annotations

import copy
import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from kapok.errors import ConfigError

__all__ = ["KAPOKMQ_KEYS", "Note", "Translation", "annotate", "is_kapokmq", "translate"]

HIDDEN = "(hidden)"

# Every key of KapokMQ's application.yaml (reference: the KapokMQ spec, §4), and of its
# registry's (Serena), with what Kapok does with it; the notes repeat these reasons.
KAPOKMQ_KEYS = (
    "server.addr", "server.port",
    "mq.secretKey", "mq.pushType", "mq.messageChanBuffer", "mq.pushMessagesSpeed", "mq.pushCount",
    "mq.pushRetryTime", "mq.persistentFile", "mq.isPersistent", "mq.recoveryStrategy",
    "mq.persistentTime", "mq.isCleanConsumed", "mq.isRePush", "mq.isClean", "mq.checkSpeed", "mq.cleanTime",
    "cluster.isCluster", "cluster.gossipPort", "cluster.registryAddr", "cluster.registryGossipPort",
    "sync.isSync", "sync.isSlave", "sync.masterProtocol", "sync.masterAddr", "sync.masterPort",
    "registry.secretKey", "registry.gossipPort",
)  # fmt: skip
_KAPOKMQ_ONLY = ("sync", "registry")  # sections Kapok does not have
_SHARED = {"server.port"}  # spelt the same in both: not a sign of a KapokMQ file
_FSYNC = {0: "never", 1: "interval", 2: "always"}
_SCHEMES = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


@dataclass(frozen=True, slots=True)
class Note:
    """What became of one KapokMQ key: one log line."""

    key: str
    level: int
    text: str


@dataclass(frozen=True, slots=True)
class Translation:
    raw: dict[str, Any]  # the Kapok mapping (only the keys the file gave)
    notes: list[Note]
    origin: dict[str, str]  # Kapok key path -> the KapokMQ key it came from


def is_kapokmq(raw: Mapping[str, Any]) -> bool:
    """True when ``raw`` (a parsed YAML file) holds a key that only KapokMQ has."""
    return any(key not in _SHARED and _present(raw, key) for key in KAPOKMQ_KEYS)


def annotate(error: ConfigError, origin: Mapping[str, str]) -> ConfigError:
    """``mq.push_type: expected ...`` -> ``mq.pushType (as mq.push_type): expected ...``."""
    path, sep, rest = error.message.partition(": ")
    if not sep or path not in origin:
        return error
    return ConfigError(f"{origin[path]} (as {path}): {rest}")


def translate(raw: Mapping[str, Any]) -> Translation:
    """The Kapok equivalent of KapokMQ file ``raw``: its other (Kapok) keys unchanged."""
    t = _Translator(raw)
    t.server()
    t.mq()
    t.cluster()
    t.sync()
    for key in ("registry.secretKey", "registry.gossipPort"):
        t.ignore(key, "no registry process in Kapok: every node answers /Registry/GetNodes")
    return Translation(t.merged(), t.notes, t.origin)


# ---------------------------------------------------------------------------------------


def _present(raw: Mapping[str, Any], path: str) -> bool:
    section, _, key = path.partition(".")
    part = raw.get(section)
    return isinstance(part, Mapping) and key in part


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


class _Translator:
    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        self.out: dict[str, Any] = {}
        self.notes: list[Note] = []
        self.origin: dict[str, str] = {}

    # ------------------------------------------------------------ reading KapokMQ values

    def has(self, key: str) -> bool:
        return _present(self.raw, key)

    def value(self, key: str) -> Any:
        section, _, name = key.partition(".")
        return self.raw[section][name]

    def flag(self, key: str, default: bool = False) -> bool:
        if not self.has(key):
            return default
        value = self.value(key)
        if value in (0, 1):  # True and False are 1 and 0
            return bool(value)
        raise ConfigError(f"{key}: expected 0 or 1 (a KapokMQ flag), got {_show(value)}")

    def number(self, key: str, *, choices: tuple[int, ...] = ()) -> int:
        """A non-negative integer; KapokMQ writes some of them as strings ("8011")."""
        value = self.value(key)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        number = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
        if number is not None and (not choices or number in choices):
            return number
        wanted = f"one of {', '.join(map(str, choices))}" if choices else "a non-negative integer"
        raise ConfigError(f"{key}: expected {wanted}, got {_show(value)}")

    def text(self, key: str) -> str:
        value = self.value(key)
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {_show(value)}")
        return str(value).strip()

    # ------------------------------------------------------------ recording the result

    def put(self, key: str, path: str, value: object, why: str = "", *, secret: bool = False) -> None:
        """KapokMQ ``key`` becomes Kapok ``path: value``."""
        section, _, name = path.partition(".")
        self.out.setdefault(section, {})[name] = value
        self.origin[path] = key
        shown_in = HIDDEN if secret else _show(self.value(key))
        shown_out = HIDDEN if secret else _show(value)
        self.note(key, f"{key}: {shown_in} -> {path}: {shown_out}" + (f" ({why})" if why else ""))

    def ignore(self, key: str, why: str, level: int = logging.INFO) -> None:
        if self.has(key):
            self.note(key, f"{key}: {_show(self.value(key))} -> ignored: {why}", level)

    def note(self, key: str, text: str, level: int = logging.INFO) -> None:
        self.notes.append(Note(key, level, text))

    def merged(self) -> dict[str, Any]:
        """The translated keys plus the file's Kapok keys; one key given both ways is an error."""
        rest: dict[str, Any] = {}
        for section, body in self.raw.items():
            if not isinstance(body, Mapping):
                if body is not None or section not in _KAPOKMQ_ONLY:
                    rest[section] = copy.deepcopy(body)  # Kapok's loader reports it
                continue
            keep = {k: copy.deepcopy(v) for k, v in body.items() if f"{section}.{k}" not in KAPOKMQ_KEYS}
            if section not in _KAPOKMQ_ONLY:
                rest[section] = keep
            elif keep:  # Kapok has no such section to report it
                known = [k.partition(".")[2] for k in KAPOKMQ_KEYS if k.startswith(section + ".")]
                close = difflib.get_close_matches(str(next(iter(keep))), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f" (KapokMQ's: {', '.join(known)})"
                raise ConfigError(f"{section}.{next(iter(keep))}: unknown key{hint}")
        for section, body in self.out.items():
            target = rest.setdefault(section, {})
            for name, value in body.items():
                if name in target:
                    path = f"{section}.{name}"
                    origin = self.origin[path]
                    raise ConfigError(f"{path}: given both as a Kapok key and as KapokMQ's {origin}")
                target[name] = value
        return rest

    # ------------------------------------------------------------ the sections

    def server(self) -> None:
        if self.has("server.addr") and self.text("server.addr"):
            self.put(
                "server.addr", "server.host", self.text("server.addr"),
                "Kapok listens on this address; KapokMQ listened on every interface and only "
                "advertised it: set server.host: 0.0.0.0 for that",
            )  # fmt: skip
        if self.has("server.port"):
            self.put("server.port", "server.port", self.number("server.port"))

    def mq(self) -> None:
        has, put, ignore = self.has, self.put, self.ignore
        if has("mq.secretKey"):
            put("mq.secretKey", "mq.secret_key", self.text("mq.secretKey"), secret=True)
        if has("mq.pushType"):
            put("mq.pushType", "mq.push_type", self.number("mq.pushType"), "also per topic in mq.topics")
        if has("mq.messageChanBuffer"):
            put(
                "mq.messageChanBuffer", "mq.max_length", self.number("mq.messageChanBuffer"),
                "per topic in Kapok, nothing preallocated; a full topic refuses producers "
                "(queue_full, or mq.overflow: drop_oldest) instead of blocking them",
            )  # fmt: skip
        ignore("mq.pushMessagesSpeed", "not needed: no pacing, consumers are fed by credit (mq.prefetch)")
        ignore("mq.pushCount", "not needed: no pacing; frames are batched up to server.max_batch")
        if has("mq.pushRetryTime"):
            put(
                "mq.pushRetryTime", "mq.ack_timeout_s", float(self.number("mq.pushRetryTime")),
                "counted from each delivery, not from creation; capped by mq.max_deliveries",
            )  # fmt: skip
        if has("mq.persistentFile"):
            folder = PurePath(self.text("mq.persistentFile") or "MQDATA").parent / "data"
            put(
                "mq.persistentFile", "storage.dir", folder.as_posix(),
                "Kapok keeps snapshots and WAL in one directory; load KapokMQ's MQDATA and "
                "WAL.log once with `kapok import-kapokmq DIR`",
            )  # fmt: skip
        if has("mq.isPersistent"):
            level = self.number("mq.isPersistent", choices=(0, 1, 2))
            why = {
                0: "Kapok always keeps a WAL and snapshots; `never` leaves flushing to the OS",
                1: "snapshots plus a WAL fsynced every storage.fsync_interval_ms",
                2: "every write fsynced before the producer's confirmation (group commit)",
            }[level]
            put("mq.isPersistent", "storage.fsync", _FSYNC[level], why)
        if has("mq.recoveryStrategy") and self.number("mq.recoveryStrategy") == 1:
            ignore("mq.recoveryStrategy", "not needed: a node always recovers from its snapshot and WAL")
        else:
            ignore(
                "mq.recoveryStrategy", "Kapok always recovers; to start empty, use an empty storage.dir",
                logging.WARNING,
            )  # fmt: skip
        if has("mq.persistentTime"):
            put("mq.persistentTime", "storage.snapshot_interval_s", float(self.number("mq.persistentTime")))
        self.retention()
        if not has("mq.isRePush") or self.flag("mq.isRePush"):
            ignore("mq.isRePush", "not needed: redelivery is always on; mq.max_deliveries bounds it")
        else:
            ignore(
                "mq.isRePush", "Kapok always redelivers an unacked message; mq.max_deliveries bounds it",
                logging.WARNING,
            )  # fmt: skip
        ignore("mq.checkSpeed", "not needed: timers are event-driven, no periodic scan")

    def retention(self) -> None:
        """isCleanConsumed, isClean and cleanTime together decide how long consumed messages stay."""
        unconsumed = "unconsumed messages never expire in Kapok unless a TTL says so (mq.ttl_s)"
        if self.flag("mq.isCleanConsumed"):
            self.put("mq.isCleanConsumed", "mq.retain_consumed_s", 0.0, "consumed messages go at once")
            self.ignore("mq.isClean", f"mq.isCleanConsumed deletes consumed messages at once; {unconsumed}")
            self.ignore("mq.cleanTime", "mq.isCleanConsumed deletes consumed messages at once")
            return
        self.ignore("mq.isCleanConsumed", "consumed messages are kept mq.retain_consumed_s")
        if self.flag("mq.isClean") and self.has("mq.cleanTime"):
            self.ignore("mq.isClean", f"mq.cleanTime sets mq.retain_consumed_s; {unconsumed}")
            self.put(
                "mq.cleanTime", "mq.retain_consumed_s", float(self.number("mq.cleanTime")),
                f"for consumed messages; {unconsumed}",
            )  # fmt: skip
        else:
            kept = "consumed messages are kept mq.retain_consumed_s (3600 s), at most mq.retain_consumed_max"
            self.ignore("mq.isClean", f"{kept}; {unconsumed}")
            self.ignore("mq.cleanTime", "mq.isClean is 0")

    def cluster(self) -> None:
        if self.has("cluster.isCluster"):
            self.put("cluster.isCluster", "cluster.enabled", self.flag("cluster.isCluster"))
        host = self.text("server.addr") if self.has("server.addr") else ""
        host = host or "127.0.0.1"
        bind = ""
        if self.has("cluster.gossipPort"):
            bind = f"{host}:{self.number('cluster.gossipPort')}"
            self.put("cluster.gossipPort", "cluster.bind", bind, "its host is server.addr")
        if self.has("cluster.registryAddr") or self.has("cluster.registryGossipPort"):
            has = self.has
            registry = self.text("cluster.registryAddr") if has("cluster.registryAddr") else ""
            port = self.number("cluster.registryGossipPort") if has("cluster.registryGossipPort") else 8041
            seed = f"{registry or '127.0.0.1'}:{port}"  # KapokMQ's defaults for a missing half
            why = "no registry in Kapok: any member can be a seed; list other Kapok nodes' gossip addresses"
            for key in ("cluster.registryAddr", "cluster.registryGossipPort"):
                if not self.has(key):
                    continue
                if seed == bind:
                    self.ignore(key, "the seed would be this node itself")
                elif "cluster.seeds" in self.origin:
                    self.note(key, f"{key}: {_show(self.value(key))} -> cluster.seeds: {[seed]!r} (as above)")
                else:
                    self.put(key, "cluster.seeds", [seed], why)

    def sync(self) -> None:
        if not self.flag("sync.isSync"):
            self.ignore("sync.isSync", "a Kapok node pairs by naming its master (replication.role: slave)")
            for key in ("sync.isSlave", "sync.masterProtocol", "sync.masterAddr", "sync.masterPort"):
                self.ignore(key, "sync.isSync is 0")
            return
        self.ignore("sync.isSync", "not needed: a master always accepts its slave; the slave names it")
        if not self.flag("sync.isSlave"):
            if self.has("sync.isSlave"):
                self.put("sync.isSlave", "replication.role", "master")
            for key in ("sync.masterProtocol", "sync.masterAddr", "sync.masterPort"):
                self.ignore(key, "this node is a master (sync.isSlave is 0)")
            return
        self.put("sync.isSlave", "replication.role", "slave")
        protocol = self.text("sync.masterProtocol").lower() if self.has("sync.masterProtocol") else "ws"
        if protocol not in _SCHEMES:
            raise ConfigError(f"sync.masterProtocol: expected ws or wss, got {protocol!r}")
        if not self.has("sync.masterAddr") or not self.text("sync.masterAddr"):
            raise ConfigError("sync.masterAddr: required when sync.isSlave is 1 (the master's address)")
        if not self.has("sync.masterPort"):
            raise ConfigError("sync.masterPort: required when sync.isSlave is 1 (the master's HTTP port)")
        addr = self.text("sync.masterAddr")
        host = f"[{addr}]" if ":" in addr else addr
        url = f"{_SCHEMES[protocol]}://{host}:{self.number('sync.masterPort')}"
        parts = {"sync.masterProtocol": "scheme", "sync.masterAddr": "host", "sync.masterPort": "port"}
        first = True
        for key, part in parts.items():
            if not self.has(key):
                continue
            if first:
                self.put(key, "replication.master", url, f"its {part}")
                first = False
            else:
                self.note(key, f"{key}: {_show(self.value(key))} -> replication.master: {url!r} (its {part})")
