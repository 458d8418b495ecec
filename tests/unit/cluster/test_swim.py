"""The probe round, relays, nacks and local health, piggybacking, gossip, push-pull, join
and leave of ``Swim``, driven by hand: effects are decoded and delivered by the test."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kapok.cluster.codec import Codec, KeyRing
from kapok.cluster.config import LAN
from kapok.cluster.messages import (
    Ack,
    Alive,
    Dead,
    Effect,
    IndirectPing,
    Message,
    Nack,
    NodeMeta,
    Ping,
    PushPull,
    Send,
    SendStream,
    State,
    Suspect,
)
from kapok.cluster.swim import Swim

CODEC = Codec(KeyRing([b"k"]))


def make(name: str, seed: int = 1) -> Swim:
    """A node whose own first ``Alive`` is already spread (so packets carry only what a test sends)."""
    swim = Swim(name, f"{name}:1", NodeMeta(name), LAN, random.Random(seed), codec=CODEC)
    swim.table.queue.clear()
    return swim


def sends(effects: list[Effect]) -> list[tuple[str, tuple[Message, ...]]]:
    out = []
    for e in effects:
        if isinstance(e, Send):
            decoded = CODEC.decode(e.data)
            assert isinstance(decoded, tuple)
            out.append((e.addr, decoded))
    return out


def cluster_view(swim: Swim, *peers: str, now: float = 0.0) -> None:
    swim.handle_packet([Alive(0, p, f"{p}:1", NodeMeta(p)) for p in peers], "", now)
    swim.table.queue.clear()


def first_probe(swim: Swim) -> tuple[float, str, Ping]:
    """Tick until the first probe goes out: (time, target address, the ping)."""
    t = swim.next_deadline()
    for addr, msgs in sends(swim.tick(t)):
        for m in msgs:
            if isinstance(m, Ping):
                return t, addr, m
    raise AssertionError("no probe sent")


def test_nothing_is_due_before_the_first_call() -> None:
    swim = make("a")
    assert swim.next_deadline() == -float("inf")
    swim.tick(5.0)
    assert 5.0 <= swim.next_deadline() <= 5.0 + LAN.probe_interval_s


def test_ping_is_acked_unless_meant_for_another_name() -> None:
    swim = make("a")
    assert sends(swim.handle_packet(CODEC.encode([Ping(7, "a", "b")]), "b:1", 1.0)) == [("b:1", (Ack(7),))]
    assert swim.handle_packet(CODEC.encode([Ping(8, "old-name", "b")]), "b:1", 1.0) == []
    assert swim.stats["wrong_target"] == 1


def test_successful_probe_lowers_local_health_and_schedules_the_next() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d")
    swim.table.awareness.apply(2)
    t, addr, ping = first_probe(swim)
    assert ping.source == "a" and addr == f"{ping.target}:1"
    assert swim.next_deadline() == pytest.approx(t + LAN.probe_timeout_s)
    swim.handle_packet([Ack(ping.seq)], addr, t + 0.01)
    assert swim.awareness == 1
    assert swim.next_deadline() == pytest.approx(t + LAN.probe_interval_s)


def test_failed_probe_goes_indirect_then_suspects_and_counts_missing_nacks() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d", "e")
    t, addr, ping = first_probe(swim)
    out = sends(swim.tick(t + LAN.probe_timeout_s))
    helpers = {a for a, msgs in out if any(isinstance(m, IndirectPing) for m in msgs)}
    assert len(helpers) == 3 and addr not in helpers
    ind = next(m for _, msgs in out for m in msgs if isinstance(m, IndirectPing))
    assert (ind.seq, ind.target, ind.target_addr, ind.nack) == (ping.seq, ping.target, addr, True)
    swim.handle_packet([Nack(ping.seq)], "c:1", t + 0.9)  # one helper answered: it is alive
    swim.tick(t + LAN.probe_interval_s)
    assert swim.member(ping.target).state is State.SUSPECT  # type: ignore[union-attr]
    assert swim.awareness == 2  # three nacks expected, one came
    assert swim.stats["probe_failures"] == 1


def test_relayed_ack_saves_the_target() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d", "e")
    t, _, ping = first_probe(swim)
    swim.tick(t + LAN.probe_timeout_s)
    swim.handle_packet([Ack(ping.seq)], "c:1", t + 0.7)
    swim.tick(t + 5.0)
    assert swim.member(ping.target).state is State.ALIVE  # type: ignore[union-attr]


def test_local_health_stretches_the_round_deadline_but_not_the_probe_timeout() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c")
    swim.table.awareness.apply(3)
    t, _, ping = first_probe(swim)
    assert swim.next_deadline() == pytest.approx(t + LAN.probe_timeout_s)
    swim.tick(t + LAN.probe_timeout_s)
    assert swim.next_deadline() == pytest.approx(t + 4 * LAN.probe_interval_s)
    swim.handle_packet([Ack(ping.seq)], "b:1", t + 3.0)  # late, but within the stretched round
    assert swim.member(ping.target).state is State.ALIVE  # type: ignore[union-attr]


def streams(effects: list[Effect]) -> list[tuple[str, tuple[Message, ...]]]:
    out = []
    for e in effects:
        if isinstance(e, SendStream):
            decoded = CODEC.decode(e.data, LAN.max_stream_bytes)
            assert isinstance(decoded, tuple)
            out.append((e.addr, decoded))
    return out


def test_unanswered_probe_also_pings_over_a_stream_whose_ack_saves_the_target() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d", "e")
    swim.table.awareness.apply(2)
    t, addr, ping = first_probe(swim)
    effects = swim.tick(t + LAN.probe_timeout_s)
    assert len([m for _, msgs in sends(effects) for m in msgs if isinstance(m, IndirectPing)]) == 3
    [(stream_addr, (stream_ping,))] = streams(effects)
    assert stream_addr == addr
    assert stream_ping == Ping(ping.seq, ping.target, "a", "a:1")
    # The target answers to the address the ping carries, over a stream and by datagram.
    target = make(ping.target, seed=2)
    reply = target.handle_stream(CODEC.encode([stream_ping]), t + 0.6)
    assert streams(reply) == [("a:1", (Ack(ping.seq),))]
    assert sends(reply) == [("a:1", (Ack(ping.seq),))]
    [ack] = [e for e in reply if isinstance(e, SendStream)]
    assert swim.next_deadline() == pytest.approx(t + 3 * LAN.probe_interval_s)  # the verdict, if no ack
    swim.handle_stream(ack.data, t + 0.61)
    assert swim.next_deadline() == pytest.approx(t + LAN.probe_interval_s)  # the next round instead
    swim.tick(t + 3 * LAN.probe_interval_s)
    assert swim.member(ping.target).state is State.ALIVE  # type: ignore[union-attr]
    assert swim.stats["probe_failures"] == 0 and swim.stats["stream_ping_saves"] == 1
    assert swim.awareness == 1  # a successful probe, like a direct ack


def test_stream_ping_carries_the_buddy_suspect_so_the_target_refutes() -> None:
    swim = make("a")
    cluster_view(swim, "b")
    swim.handle_packet([Suspect(0, "b", "c")], "c:1", 0.0)
    swim.table.queue.clear()
    t, _, ping = first_probe(swim)
    [(_, msgs)] = streams(swim.tick(t + LAN.probe_timeout_s))
    assert msgs == (Ping(ping.seq, "b", "a", "a:1"), Suspect(0, "b", "a"))
    target = make("b", seed=2)
    assert streams(target.handle_stream(CODEC.encode(msgs), t + 0.6)) == [("a:1", (Ack(ping.seq),))]
    assert target.incarnation == 1  # refuted: the alive goes out with the next gossip


def test_stream_ping_with_an_outdated_buddy_suspect_gets_the_current_alive_back() -> None:
    target = make("b", seed=2)
    target.handle_packet([Suspect(0, "b", "c")], "c:1", 0.0)  # refutes: incarnation 1
    target.table.queue.clear()
    blob = CODEC.encode([Ping(9, "b", "a", "a:1"), Suspect(0, "b", "a")])
    assert sends(target.handle_stream(blob, 1.0)) == [
        ("a:1", (Ack(9),)),
        ("a:1", (Alive(1, "b", "b:1", NodeMeta("b")),)),  # the prober missed the refutation
    ]


def test_stream_pings_can_be_turned_off() -> None:
    swim = Swim("a", "a:1", NodeMeta("a"), replace(LAN, tcp_pings=False), random.Random(1), codec=CODEC)
    swim.table.queue.clear()
    cluster_view(swim, "b", "c", "d", "e")
    t, _, ping = first_probe(swim)
    assert streams(swim.tick(t + LAN.probe_timeout_s)) == []
    swim.tick(t + LAN.probe_interval_s)
    assert swim.member(ping.target).state is State.SUSPECT  # type: ignore[union-attr]
    assert swim.stats["stream_pings"] == 0


def test_stream_ack_after_the_round_deadline_does_not_undo_the_suspicion() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d", "e")
    t, _, ping = first_probe(swim)
    swim.tick(t + LAN.probe_timeout_s)
    swim.tick(t + LAN.probe_interval_s)
    swim.handle_stream(CODEC.encode([Ack(ping.seq)]), t + LAN.probe_interval_s + 0.1)
    assert swim.member(ping.target).state is State.SUSPECT  # type: ignore[union-attr]
    assert swim.stats["late_acks"] == 1 and swim.stats["stream_ping_saves"] == 0


def test_stream_messages_that_need_a_sender_address_are_dropped() -> None:
    swim = make("a")
    # a ping without a reply address, and an indirect ping, have nowhere to go from a stream
    assert swim.handle_stream(CODEC.encode([Ping(5, "a", "b")]), 1.0) == []
    assert swim.handle_stream(CODEC.encode([IndirectPing(6, "t", "t:1", True)]), 1.0) == []
    assert swim.stats["unroutable"] == 2
    # a stream ping meant for another name is not answered either
    assert swim.handle_stream(CODEC.encode([Ping(7, "old-name", "b", "b:1")]), 1.0) == []
    assert swim.stats["wrong_target"] == 1


def test_helper_relays_the_ack_or_answers_a_nack() -> None:
    helper = make("h")
    out = sends(helper.handle_packet([IndirectPing(41, "t", "t:1", True)], "a:1", 10.0))
    [(addr, (ping,))] = out
    assert addr == "t:1" and isinstance(ping, Ping) and ping.target == "t"
    assert sends(helper.handle_packet([Ack(ping.seq)], "t:1", 10.1)) == [("a:1", (Ack(41),))]
    # a second request whose target stays silent: nack after 80 % of the probe timeout
    [(_, (ping2,))] = sends(helper.handle_packet([IndirectPing(42, "t", "t:1", True)], "a:1", 20.0))
    assert isinstance(ping2, Ping)
    nack_at = 20.0 + 0.8 * LAN.probe_timeout_s
    assert helper.next_deadline() <= nack_at
    assert sends(helper.tick(nack_at - 0.01)) == []
    assert sends(helper.tick(nack_at)) == [("a:1", (Nack(42),))]
    assert helper.handle_packet([Ack(ping2.seq)], "t:1", 21.0) == []  # too late: dropped


def test_buddy_system_packet() -> None:
    swim = make("a")
    cluster_view(swim, "b")
    swim.handle_packet([Suspect(0, "b", "c")], "c:1", 0.0)
    swim.table.queue.clear()
    out = sends(swim.tick(swim.next_deadline()))
    [(addr, msgs)] = out
    assert addr == "b:1"
    assert isinstance(msgs[0], Ping) and Suspect(0, "b", "a") in msgs


def test_updates_ride_on_every_packet_within_the_size_limit() -> None:
    swim = make("a")
    many = [
        Alive(1, f"node-{i:03d}", f"10.0.0.{i}:7946", NodeMeta(f"node-{i:03d}", "http://x" * 5))
        for i in range(60)
    ]
    swim.handle_packet(many, "x:1", 1.0)
    out = swim.handle_packet([Ping(3, "a", "x")], "x:1", 1.0)
    [packet] = [e for e in out if isinstance(e, Send)]
    assert len(packet.data) <= LAN.max_packet_bytes
    decoded = CODEC.decode(packet.data)
    assert isinstance(decoded, tuple) and decoded[0] == Ack(3) and len(decoded) > 5


def test_gossip_fans_out_while_something_is_queued_then_goes_quiet() -> None:
    swim = make("a")
    swim.tick(0.0)
    cluster_view(swim, *"bcdefg")
    swim.handle_packet([Dead(0, "g", "b")], "b:1", 0.0)
    t = 0.0
    gossip_packets = 0
    for _ in range(200):
        t = swim.next_deadline()
        out = sends(swim.tick(t))
        gossip_packets += sum(1 for _, msgs in out if msgs and not isinstance(msgs[0], Ping))
        for addr, msgs in out:  # answer probes so nothing else gets suspected
            for m in msgs:
                if isinstance(m, Ping):
                    swim.handle_packet([Ack(m.seq)], addr, t)
        if "g" not in swim.table.queue:
            break
    assert 1 <= gossip_packets <= 3 * 4  # about retransmit_limit(4, n=6) = 4 sends, ≤ 3 per tick
    assert swim.next_deadline() >= t  # only the probe timer and push-pull remain
    assert not swim.table.queue


def test_push_pull_and_its_reply() -> None:
    a, b = make("a"), make("b", seed=2)
    cluster_view(a, "b")
    a.tick(0.0)
    effects = a.tick(LAN.push_pull_interval_s)
    [stream] = [e for e in effects if isinstance(e, SendStream)]
    assert stream.addr == "b:1"
    reply = [e for e in b.handle_stream(stream.data, 31.0) if isinstance(e, SendStream)]
    assert [e.addr for e in reply] == ["a:1"]
    assert b.member("a") is not None and b.member("a").state is State.ALIVE  # type: ignore[union-attr]
    assert [
        e for e in a.handle_stream(reply[0].data, 31.1) if isinstance(e, SendStream)
    ] == []  # no reply to a reply


def test_join_exchanges_state_with_the_seeds_and_retries_until_someone_answers() -> None:
    a = make("a")
    effects = a.join(["s1:1", "a:1", "s2:1"], 0.0)
    assert sorted(e.addr for e in effects if isinstance(e, SendStream)) == ["s1:1", "s2:1"]
    decoded = CODEC.decode(next(e for e in effects if isinstance(e, SendStream)).data, 1 << 20)
    assert isinstance(decoded, tuple) and isinstance(decoded[0], PushPull) and decoded[0].join
    retry = a.tick(LAN.join_retry_s)
    assert sum(isinstance(e, SendStream) for e in retry) >= 2
    a.handle_packet([Alive(0, "s1", "s1:1", NodeMeta("s1"))], "s1:1", 6.0)
    later = a.tick(2 * LAN.join_retry_s + 0.01)
    assert not any(isinstance(e, SendStream) and e.addr == "s2:1" for e in later)


def test_leave_is_sent_at_once_and_finishes() -> None:
    swim = make("a")
    cluster_view(swim, "b", "c", "d")
    out = sends(swim.leave(1.0))
    assert out and all(Dead(0, "a", "a") in msgs for _, msgs in out)
    assert swim.member("a").state is State.LEFT  # type: ignore[union-attr]
    t = 1.0
    while not swim.leave_done:
        t = swim.next_deadline()
        swim.tick(t)
        assert t < 30.0
    assert not any(isinstance(m, Ping) for _, msgs in sends(swim.tick(t + 5.0)) for m in msgs)


def test_bad_packets_are_counted_and_dropped() -> None:
    swim = make("a")
    assert swim.handle_packet(b"\xa1" + b"\0" * 40, "x:1", 1.0) == []
    assert swim.handle_packet(Codec(KeyRing([b"other"])).encode([Ack(1)]), "x:1", 1.0) == []
    assert swim.handle_packet(b"\x00", "x:1", 1.0) == []
    assert (swim.stats["drop_auth"], swim.stats["drop_truncated"]) == (2, 1)


def test_metadata_must_fit() -> None:
    with pytest.raises(ValueError):
        Swim("a", "a:1", NodeMeta("a", "x" * 600), LAN, random.Random(1))
    with pytest.raises(ValueError):
        Swim("a", "a:1", NodeMeta("b"), LAN, random.Random(1))
    with pytest.raises(ValueError):
        Swim("a", "a:1", NodeMeta("a", load=float("nan")), LAN, random.Random(1))
