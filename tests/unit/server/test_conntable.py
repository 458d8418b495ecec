"""``ConnectionTable``: connections counted from accept, deadlines per state, eviction of
the oldest untrusted connection at the limit (pure, time is an argument)."""

from __future__ import annotations

from kapok.server.guard.conntable import HANDSHAKE_GRACE_S, Admit, ConnectionTable, ConnState, Limits

LIMITS = Limits(max_connections=3, header_timeout_s=10.0, body_timeout_s=30.0, idle_timeout_s=75.0,
                handshake_timeout_s=5.0)  # fmt: skip


def test_at_the_limit_the_oldest_untrusted_connection_makes_room() -> None:
    table = ConnectionTable(LIMITS)
    for key in ("a", "b", "c"):
        assert table.admit(key, 0.0) == (Admit.YES, None)
    table.trust("a")
    assert table.admit("d", 1.0) == (Admit.EVICT, "b")  # a is trusted: b is the oldest other
    assert "b" not in table and len(table) == 3
    table.trust("c")
    table.trust("d")
    assert table.admit("e", 2.0) == (Admit.NO, None)  # all trusted: the newcomer is refused
    assert "e" not in table


def test_deadlines_follow_the_state() -> None:
    table = ConnectionTable(Limits(100, 10.0, 30.0, 75.0, 5.0))
    table.admit("idle", 0.0)
    table.admit("body", 0.0)
    table.admit("busy", 0.0)
    table.admit("ws", 0.0)
    table.admit("open", 0.0)
    table.set_state("body", ConnState.BODY, 5.0)
    table.set_state("busy", ConnState.BUSY, 5.0)
    table.set_state("ws", ConnState.HANDSHAKE, 5.0)
    table.set_state("open", ConnState.OPEN, 5.0)
    assert table.expired(9.9) == []
    assert table.expired(10.0) == [("idle", ConnState.IDLE)]
    assert table.expired(10.0 + HANDSHAKE_GRACE_S) == [("idle", ConnState.IDLE), ("ws", ConnState.HANDSHAKE)]
    assert ("body", ConnState.BODY) in table.expired(35.0)
    assert {k for k, _ in table.expired(1e9)} == {"idle", "body", "ws"}  # busy and open never
    table.set_state("busy", ConnState.IDLE, 100.0)  # its answer went out: headers again
    assert ("busy", ConnState.IDLE) in table.expired(110.0)
    table.closed("idle")
    table.set_state("gone", ConnState.BUSY, 0.0)  # unknown keys are ignored
    assert "idle" not in table and "gone" not in table
    assert table.count(ConnState.OPEN) == 1


def test_a_trusted_connection_may_idle_longer_between_requests() -> None:
    table = ConnectionTable(LIMITS)
    table.admit("key", 0.0)
    table.admit("anon", 0.0)
    table.trust("key")
    for conn in ("key", "anon"):
        table.set_state(conn, ConnState.BUSY, 1.0)
        table.set_state(conn, ConnState.IDLE, 2.0)  # answered; kept alive
    assert table.expired(12.0) == [("anon", ConnState.IDLE)]
    assert table.reason("anon", ConnState.IDLE) == "header_timeout"
    assert table.expired(77.0) == [("key", ConnState.IDLE), ("anon", ConnState.IDLE)]
    assert table.reason("key", ConnState.IDLE) == "idle_timeout"
    assert table.reason("key", ConnState.BODY) == "body_timeout"
