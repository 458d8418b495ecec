"""Gossip packet codec: every message survives a round trip; every damaged, foreign or
malformed packet comes back as a ``DecodeError`` (never an exception, never a message)."""

from __future__ import annotations

import hypothesis.strategies as st
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from kapok.cluster.codec import AUTH_HEADER, DECODE_REASONS, PLAIN_HEADER, Codec, DecodeError, KeyRing
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

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(min_size=1, max_size=40)
ints = st.integers(min_value=0, max_value=2**63 - 1)
seqs = st.integers(min_value=0, max_value=2**32 - 1)
addrs = st.text(max_size=30)
loads = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def metas(draw: st.DrawFn, name: str | None = None) -> NodeMeta:
    return NodeMeta(
        name if name is not None else draw(names),
        draw(addrs),
        draw(st.sampled_from(["master", "slave"])),
        draw(st.none() | names),
        draw(addrs),
        draw(loads),
        draw(seqs),
        draw(st.booleans()),
        draw(st.none() | st.tuples(seqs, seqs, st.floats(min_value=0, max_value=1e9))),
        draw(names | st.just("")),
    )


@st.composite
def alives(draw: st.DrawFn) -> Alive:
    node = draw(names)
    return Alive(draw(ints), node, draw(addrs), draw(metas(node)))


@st.composite
def node_states(draw: st.DrawFn) -> NodeState:
    node = draw(names)
    return NodeState(node, draw(addrs), draw(ints), draw(st.sampled_from(list(State))), draw(metas(node)))


small_messages = st.one_of(
    st.builds(Ping, seqs, names, names, addrs),
    st.builds(IndirectPing, seqs, names, addrs, st.booleans()),
    st.builds(Ack, seqs),
    st.builds(Nack, seqs),
    st.builds(Suspect, ints, names, names),
    st.builds(Dead, ints, names, names),
    alives(),
)
push_pulls = st.builds(
    PushPull, names, addrs, st.booleans(), st.booleans(), st.lists(node_states(), max_size=8).map(tuple)
)

SIGNED = Codec(KeyRing([b"k1"]))


@SETTINGS
@given(st.lists(small_messages, min_size=1, max_size=6))
def test_packet_round_trip(msgs: list[Message]) -> None:
    data = SIGNED.encode(msgs)
    assert SIGNED.decode(data, max_bytes=1 << 20) == tuple(msgs)


@SETTINGS
@given(push_pulls)
def test_push_pull_round_trip_both_encoders(pp: PushPull) -> None:
    whole = SIGNED.seal([SIGNED.encode_message(pp)])
    entries = [SIGNED.encode_state(s.name, s.addr, s.incarnation, s.state, s.meta) for s in pp.states]
    spliced = SIGNED.seal([SIGNED.encode_push_pull(pp.source, pp.source_addr, pp.join, pp.reply, entries)])
    assert whole == spliced
    assert SIGNED.decode(whole, max_bytes=1 << 20) == (pp,)
    assert SIGNED.decode(whole, max_bytes=1 << 20) == (pp,)  # a second time, through the row cache


@SETTINGS
@given(st.lists(small_messages, min_size=1, max_size=4), st.data())
def test_any_flipped_bit_is_rejected(msgs: list[Message], data: st.DataObject) -> None:
    packet = bytearray(SIGNED.encode(msgs))
    bit = data.draw(st.integers(min_value=0, max_value=len(packet) * 8 - 1))
    packet[bit // 8] ^= 1 << (bit % 8)
    result = SIGNED.decode(bytes(packet), max_bytes=1 << 20)
    assert isinstance(result, DecodeError)
    assert result.reason in {"auth", "version", "unauthenticated"}


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_never_raise(data: bytes) -> None:
    for codec in (SIGNED, Codec()):
        result = codec.decode(data)
        assert isinstance(result, DecodeError)
        assert result.reason in DECODE_REASONS


def _plain(body: bytes) -> bytes:
    return bytes([PLAIN_HEADER]) + body


@SETTINGS
@given(st.recursive(st.none() | st.booleans() | ints | st.text(max_size=5), st.lists, max_leaves=12))
def test_authentic_but_malformed_bodies_are_errors(value: object) -> None:
    """An authentic packet still can't smuggle a malformed message through: anything that is
    not an error is a tuple of well-typed messages (or nothing, for unknown type codes)."""
    result = Codec().decode(_plain(orjson.dumps([value])))
    if not isinstance(result, DecodeError):
        assert all(
            isinstance(m, Ack | Nack | Ping | IndirectPing | Suspect | Alive | Dead | PushPull)
            for m in result
        )


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b"[]x",
        b"[[0,1,2,3]]",  # ping with a numeric target
        b'[[0,-1,"a","b"]]',  # negative sequence number
        b'[[0,1,"a"]]',  # missing field
        b'[[0,1,"a","b",7]]',  # stream reply address not a string
        b'[[0,1,"a","b","c","d"]]',  # extra field
        b'[[1,1,"a","b","yes"]]',  # nack flag not a boolean
        b'[[4,1,"a","b",["u","r",null,"v","high"]]]',  # load not a number
        b'[[4,1,"a","b",["u","r",null,"v"]]]',  # short meta
        b'[[4,1,"a","b",["u","r",null,"v",0,-1]]]',  # negative epoch
        b'[[4,1,"a","b",["u","r",null,"v",0,1,"yes"]]]',  # active not a boolean
        b'[[4,1,"a","b",["u","r",null,"v",0,1,true,[1,2]]]]',  # short lag
        b'[[4,1,"a","b",["u","r",null,"v",0,1,true,null,"p",9,0]]]',  # too many meta fields
        b'[[4,1,"a","b",["u","r",null,"v",0,1,true,null,"p",-1]]]',  # alone_since is an LSN
        b'[[4,1,"a","b",["u","r",null,"v",0,1,true,null,9]]]',  # pair_id not a string
        b'[[6,"s","a",false,true,[["n","a",1,"zombie",["u","r",null,"v",0]]]]]',  # unknown state
        b'[[6,"s","a",false,true,[["n"]]]]',  # short row
        b'[[3,1,"' + b"x" * 300 + b'","b"]]',  # name over the length limit
        b"[[true,1]]",  # type code not an integer
    ],
)
def test_schema_violations_are_malformed(body: bytes) -> None:
    result = Codec().decode(_plain(body))
    assert isinstance(result, DecodeError)
    assert result.reason == "malformed"


def test_ping_sends_its_stream_reply_address_only_when_it_has_one() -> None:
    assert Codec().encode([Ping(1, "a", "b")]) == _plain(b'[[0,1,"a","b"]]')
    assert Codec().encode([Ping(1, "a", "b", "b:1")]) == _plain(b'[[0,1,"a","b","b:1"]]')
    assert Codec().decode(_plain(b'[[0,1,"a","b","b:1"]]')) == (Ping(1, "a", "b", "b:1"),)


def _decoded(data: bytes) -> tuple[Message, ...]:
    result = Codec().decode(data)
    assert not isinstance(result, DecodeError), result
    return result


def test_meta_of_a_first_version_node_reads_with_defaults() -> None:
    # Nodes before replication sent five meta fields: an old master is active, epoch 0.
    (alive,) = _decoded(_plain(b'[[4,3,"a","a:1",["http://a","master",null,"v",1.5]]]'))
    assert isinstance(alive, Alive)
    assert alive.meta == NodeMeta("a", "http://a", "master", None, "v", 1.5, 0, True, None, "")
    (alive,) = _decoded(_plain(b'[[4,3,"b","b:1",["http://b","slave","a","v",0]]]'))
    assert isinstance(alive, Alive) and alive.meta.active is False


def test_unknown_message_types_are_skipped() -> None:
    assert Codec().decode(_plain(b'[[99,"future"],[2,7]]')) == (Ack(7),)


def test_wrong_key_is_rejected() -> None:
    data = Codec(KeyRing([b"right"])).encode([Ack(1)])
    assert Codec(KeyRing([b"wrong"])).decode(data) == DecodeError(
        "auth", "no key in the ring verifies the packet"
    )


def test_key_rotation_ring_accepts_every_key_and_signs_with_the_first() -> None:
    old, new = Codec(KeyRing([b"old"])), Codec(KeyRing([b"new"]))
    rotating = Codec(KeyRing([b"new", b"old"]))
    assert rotating.decode(old.encode([Ack(1)])) == (Ack(1),)
    assert rotating.decode(new.encode([Ack(2)])) == (Ack(2),)
    assert new.decode(rotating.encode([Ack(3)])) == (Ack(3),)
    assert isinstance(old.decode(rotating.encode([Ack(4)])), DecodeError)


def test_signed_and_open_clusters_never_mix() -> None:
    signed, plain = Codec(KeyRing([b"k"])), Codec()
    assert plain.decode(signed.encode([Ack(1)])).reason == "auth"  # type: ignore[union-attr]
    assert signed.decode(plain.encode([Ack(1)])).reason == "unauthenticated"  # type: ignore[union-attr]


def test_size_limits_and_overhead() -> None:
    codec = Codec(KeyRing([b"k"]), max_packet_bytes=1400)
    assert codec.overhead == 1 + 32 + 2
    parts = [codec.encode_message(Ack(i)) for i in range(5)]
    assert codec.packet_size(parts) == len(codec.seal(parts))
    big = codec.seal([b'"' + b"x" * 1400 + b'"'])
    assert codec.decode(big).reason == "too_large"  # type: ignore[union-attr]
    assert codec.decode(big[:2]).reason == "truncated"  # type: ignore[union-attr]
    assert codec.decode(bytes([AUTH_HEADER]) + b"\0" * 10).reason == "truncated"  # type: ignore[union-attr]
    assert codec.decode(b"\x07" + b"\0" * 40).reason == "version"  # type: ignore[union-attr]


def test_secret_string_parsing() -> None:
    assert KeyRing.from_secret("a, b ,,c").keys == (b"a", b"b", b"c")
    assert not KeyRing.from_secret("")
    with pytest.raises(ValueError):
        KeyRing([b""])
