"""Wire encoding of gossip packets and push-pull streams (pure: no I/O, no clock).

A packet is ``[header byte][tag][body]``:

* header ``0xA1``: the body is authenticated by ``tag`` = HMAC-SHA256(key, header + body),
  32 bytes; header ``0xA0``: no tag (a cluster without a secret). A node with a key ring
  accepts only ``0xA1`` packets, a node without one only ``0xA0`` packets, so a secured and
  an open cluster never merge by accident.
* body: a JSON array of messages (orjson), each message an array whose first element is
  the wire type code (memberlist's numbering: ping 0, indirect ping 1, ack 2, suspect 3,
  alive 4, dead 5, push-pull 6, nack 11). Several messages in one array is the compound
  packet: probes carry piggybacked broadcasts this way. A ping may carry a fifth element,
  the address its ack is to be streamed back to (the TCP fallback probe); older decoders
  that expect four elements would drop such a ping, which is only ever sent as a stream.

Broadcasts are encoded once (``encode_message``) and the same bytes are spliced into every
packet that carries them (``seal``), which is why the body is a plain JSON array.

The key ring holds one or more keys: the first signs, every key verifies, so a secret can be
rotated (add the new key second → move it first everywhere → drop the old one).

``decode`` never raises: a short, tampered, wrongly keyed, oversized or malformed packet comes
back as a ``DecodeError`` with a short machine ``reason`` that the driver counts. Unknown
message types inside an authentic packet are skipped (newer peers may speak more).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from kapok.cluster.messages import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Message,
    Nack,
    NodeMeta,
    NodeState,
    Ping,
    PushPull,
    State,
    Suspect,
)

__all__ = ["DECODE_REASONS", "Codec", "DecodeError", "KeyRing", "meta_size"]

AUTH_HEADER: Final = 0xA1
PLAIN_HEADER: Final = 0xA0
TAG_BYTES: Final = 32
MAX_NAME: Final = 256  # longest node name / address / meta string accepted
DECODE_REASONS: Final = ("truncated", "version", "unauthenticated", "auth", "too_large", "malformed")

T_PING, T_INDIRECT, T_ACK, T_SUSPECT, T_ALIVE, T_DEAD, T_PUSHPULL, T_NACK = 0, 1, 2, 3, 4, 5, 6, 11
_STATES: Final = {s.value: s for s in State}


@dataclass(frozen=True, slots=True)
class DecodeError:
    """Why a packet was dropped. ``reason`` is one of ``DECODE_REASONS``."""

    reason: str
    detail: str = ""


class KeyRing:
    """HMAC keys: ``keys[0]`` signs outgoing packets, any key is accepted on incoming ones."""

    __slots__ = ("_macs", "keys")

    def __init__(self, keys: Iterable[bytes] = ()) -> None:
        self.keys: tuple[bytes, ...] = tuple(keys)
        if any(not k for k in self.keys):
            raise ValueError("an HMAC key must not be empty")
        # Keyed HMAC states, copied per packet: cheaper than keying a fresh HMAC each time.
        self._macs = tuple(hmac.new(k, digestmod=hashlib.sha256) for k in self.keys)

    def sign(self, data: bytes) -> bytes:
        mac = self._macs[0].copy()
        mac.update(data)
        return mac.digest()

    def verify(self, data: bytes, tag: bytes) -> bool:
        for base in self._macs:
            mac = base.copy()
            mac.update(data)
            if hmac.compare_digest(mac.digest(), tag):
                return True
        return False

    @classmethod
    def from_secret(cls, secret: str) -> KeyRing:
        """``cluster.secret`` as configured: comma-separated keys, the first one signs."""
        return cls(part.strip().encode() for part in secret.split(",") if part.strip())

    def __bool__(self) -> bool:
        return bool(self.keys)


class _Malformed(Exception):
    pass


def _str(v: Any) -> str:
    if type(v) is not str or len(v) > MAX_NAME:
        raise _Malformed
    return v


def _uint(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise _Malformed
    return v


class Codec:
    """Encodes and seals packets for one key ring; decodes and verifies what arrives.

    Stateless apart from bounded caches of decoded metadata and push-pull rows, keyed by
    node name: periodic push-pulls repeat mostly unchanged rows, and sharing the decoded
    objects keeps a 1,000-node simulation (a million member rows) fast and small.
    """

    CACHE_MAX: Final = 16384

    def __init__(self, keyring: KeyRing | None = None, max_packet_bytes: int = 1400) -> None:
        self.keyring = keyring or KeyRing()
        self.max_packet_bytes = max_packet_bytes
        self.header_bytes = 1 + (TAG_BYTES if self.keyring else 0)
        # Fixed cost of a packet: header (+ tag) and the body's two brackets.
        self.overhead = self.header_bytes + 2
        self._meta_cache: dict[str, tuple[Any, NodeMeta]] = {}
        self._entry_cache: dict[str, tuple[Any, NodeState]] = {}
        self._decoders: dict[int, Callable[[list[Any]], Message]] = {
            T_PING: self._ping,
            T_INDIRECT: self._indirect,
            T_ACK: self._ack,
            T_NACK: self._nack,
            T_SUSPECT: self._suspect,
            T_ALIVE: self._alive,
            T_DEAD: self._dead,
            T_PUSHPULL: self._push_pull,
        }

    # ------------------------------------------------------------ encoding

    def encode_message(self, msg: Message) -> bytes:
        """One message's body fragment; ``seal`` joins fragments into a packet."""
        return _exact(orjson.dumps(_ENCODERS[type(msg)](msg)))

    def encode_state(self, name: str, addr: str, incarnation: int, state: State, meta: NodeMeta) -> bytes:
        """One push-pull entry; ``encode_push_pull`` splices cached entries into a message."""
        return _exact(orjson.dumps((name, addr, incarnation, state.value, _meta_fields(meta))))

    def encode_push_pull(
        self, source: str, addr: str, join: bool, reply: bool, entries: Sequence[bytes]
    ) -> bytes:
        """A ``PushPull`` message body fragment built from ``encode_state`` entries."""
        head = orjson.dumps((T_PUSHPULL, source, addr, join, reply))
        return head[:-1] + b",[" + b",".join(entries) + b"]]"

    def seal(self, parts: Sequence[bytes]) -> bytes:
        """Join encoded messages into one authenticated packet (or stream blob)."""
        body = b"[" + b",".join(parts) + b"]"
        if not self.keyring:
            return bytes((PLAIN_HEADER,)) + body
        head = bytes((AUTH_HEADER,))
        return head + self.keyring.sign(head + body) + body

    def encode(self, msgs: Sequence[Message]) -> bytes:
        return self.seal([self.encode_message(m) for m in msgs])

    def packet_size(self, parts: Sequence[bytes]) -> int:
        """Size ``seal(parts)`` would have, without building it."""
        return self.overhead + sum(map(len, parts)) + max(len(parts) - 1, 0)

    # ------------------------------------------------------------ decoding

    def decode(self, data: bytes, max_bytes: int | None = None) -> tuple[Message, ...] | DecodeError:
        limit = self.max_packet_bytes if max_bytes is None else max_bytes
        if len(data) > limit:
            return DecodeError("too_large", f"{len(data)} bytes > {limit}")
        if len(data) < 3:
            return DecodeError("truncated", f"{len(data)} bytes")
        head = data[0]
        if head == AUTH_HEADER:
            if not self.keyring:
                return DecodeError("auth", "signed packet, but this node has no cluster secret")
            if len(data) < 1 + TAG_BYTES + 2:
                return DecodeError("truncated", f"{len(data)} bytes")
            tag = data[1 : 1 + TAG_BYTES]
            body = data[1 + TAG_BYTES :]
            signed = data[:1] + body
            if not self.keyring.verify(signed, tag):
                return DecodeError("auth", "no key in the ring verifies the packet")
        elif head == PLAIN_HEADER:
            if self.keyring:
                return DecodeError("unauthenticated", "unsigned packet, but a cluster secret is set")
            body = data[1:]
        else:
            return DecodeError("version", f"unknown header byte 0x{head:02x}")
        try:
            items = orjson.loads(body)
            if type(items) is not list:
                raise _Malformed
            out: list[Message] = []
            decoders = self._decoders
            for item in items:
                if type(item) is not list or not item or type(item[0]) is not int:
                    raise _Malformed
                dec = decoders.get(item[0])
                if dec is not None:
                    out.append(dec(item))
            return tuple(out)
        except (_Malformed, ValueError, TypeError, KeyError, IndexError):
            return DecodeError("malformed", "body does not match the message schema")

    @staticmethod
    def _ping(f: list[Any]) -> Ping:
        if len(f) == 4:
            _, seq, target, source = f
            return Ping(_uint(seq), _str(target), _str(source))
        _, seq, target, source, reply = f
        return Ping(_uint(seq), _str(target), _str(source), _str(reply))

    @staticmethod
    def _indirect(f: list[Any]) -> IndirectPing:
        _, seq, target, addr, nack = f
        if type(nack) is not bool:
            raise _Malformed
        return IndirectPing(_uint(seq), _str(target), _str(addr), nack)

    @staticmethod
    def _ack(f: list[Any]) -> Ack:
        _, seq = f
        return Ack(_uint(seq))

    @staticmethod
    def _nack(f: list[Any]) -> Nack:
        _, seq = f
        return Nack(_uint(seq))

    @staticmethod
    def _suspect(f: list[Any]) -> Suspect:
        _, inc, node, source = f
        return Suspect(_uint(inc), _str(node), _str(source))

    @staticmethod
    def _dead(f: list[Any]) -> Dead:
        _, inc, node, source = f
        return Dead(_uint(inc), _str(node), _str(source))

    def _alive(self, f: list[Any]) -> Alive:
        _, inc, node, addr, meta = f
        name = _str(node)
        return Alive(_uint(inc), name, _str(addr), self._meta(name, meta))

    def _push_pull(self, f: list[Any]) -> PushPull:
        _, source, addr, join, reply, entries = f
        if type(join) is not bool or type(reply) is not bool or type(entries) is not list:
            raise _Malformed
        states = []
        cache = self._entry_cache
        for e in entries:
            # Push-pulls repeat mostly unchanged rows: reuse the decoded row when the raw
            # entry is equal to the one it was decoded from (equal JSON values, same types).
            hit = cache.get(e[0]) if type(e) is list and e and type(e[0]) is str else None
            if hit is not None and hit[0] == e:
                states.append(hit[1])
                continue
            name, node_addr, inc, state, meta = e
            if type(inc) is not int or inc < 0 or type(node_addr) is not str or len(node_addr) > MAX_NAME:
                raise _Malformed
            row = NodeState(_str(name), node_addr, inc, _STATES[state], self._meta(name, meta))
            if len(cache) >= self.CACHE_MAX:
                cache.clear()
            cache[name] = (e, row)
            states.append(row)
        return PushPull(_str(source), _str(addr), join, reply, tuple(states))

    def _meta(self, name: str, raw: Any) -> NodeMeta:
        hit = self._meta_cache.get(name)
        if hit is not None and hit[0] == raw:
            return hit[1]
        # Five fields from the first version; epoch, active, lag, pair_id and alone_since
        # were appended later (a member that sends five is an older node: active when it is
        # a master).
        if type(raw) is not list or not 5 <= len(raw) <= 10:
            raise _Malformed
        http_url, role, pair, version, load = raw[:5]
        if pair is not None:
            _str(pair)
        if type(load) is not float and type(load) is not int:
            raise _Malformed
        epoch = _uint(raw[5]) if len(raw) > 5 else 0
        active = raw[6] if len(raw) > 6 else role == "master"
        lag = _lag(raw[7]) if len(raw) > 7 else None
        pair_id = _str(raw[8]) if len(raw) > 8 else ""
        alone_since = _uint(raw[9]) if len(raw) > 9 and raw[9] is not None else None
        if type(active) is not bool:
            raise _Malformed
        meta = NodeMeta(
            name,
            _str(http_url),
            _str(role),
            pair,
            _str(version),
            float(load),
            epoch,
            active,
            lag,
            pair_id,
            alone_since,
        )
        if len(self._meta_cache) >= self.CACHE_MAX:
            self._meta_cache.clear()
        self._meta_cache[name] = (raw, meta)
        return meta


def _exact(data: bytes) -> bytes:
    """A right-sized copy: orjson's result keeps a ~4 KiB allocation, and these fragments live
    on in broadcast queues and row caches (a million of them in a 1,000-node simulation)."""
    return bytes(memoryview(data))


def _lag(raw: Any) -> tuple[int, int, float] | None:
    if raw is None:
        return None
    if type(raw) is not list or len(raw) != 3 or type(raw[2]) not in (int, float):
        raise _Malformed
    return (_uint(raw[0]), _uint(raw[1]), float(raw[2]))


def _meta_fields(m: NodeMeta) -> tuple[Any, ...]:
    return (m.http_url, m.role, m.pair, m.version, m.load, m.epoch, m.active, m.lag, m.pair_id, m.alone_since)


def meta_size(meta: NodeMeta) -> int:
    """Encoded size of a node's metadata, checked against ``SwimConfig.meta_max_bytes``."""
    return len(orjson.dumps(_meta_fields(meta)))


def _push_pull_fields(m: PushPull) -> tuple[Any, ...]:
    entries = [(s.name, s.addr, s.incarnation, s.state.value, _meta_fields(s.meta)) for s in m.states]
    return (T_PUSHPULL, m.source, m.source_addr, m.join, m.reply, entries)


_ENCODERS: Final[dict[type, Callable[[Any], tuple[Any, ...]]]] = {
    # The reply address is left out when empty: a datagram ping stays as small as before.
    Ping: lambda m: (
        (T_PING, m.seq, m.target, m.source, m.stream_reply_addr)
        if m.stream_reply_addr
        else (T_PING, m.seq, m.target, m.source)
    ),
    IndirectPing: lambda m: (T_INDIRECT, m.seq, m.target, m.target_addr, m.nack),
    Ack: lambda m: (T_ACK, m.seq),
    Nack: lambda m: (T_NACK, m.seq),
    Suspect: lambda m: (T_SUSPECT, m.incarnation, m.node, m.source),
    Alive: lambda m: (T_ALIVE, m.incarnation, m.node, m.addr, _meta_fields(m.meta)),
    Dead: lambda m: (T_DEAD, m.incarnation, m.node, m.source),
    PushPull: _push_pull_fields,
}
