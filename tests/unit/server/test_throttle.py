"""``AuthThrottle``: per-address back-off after wrong keys (pure, time is an argument)."""

from __future__ import annotations

from kapok.server.guard.throttle import Accept, AuthThrottle, Blocked, Reject, Verdict, address_key

T0 = 1000.0
A = "10.0.0.1"


def wrong(t: AuthThrottle, key: str, now: float = T0, addr: str = A) -> Verdict:
    return t.judge(addr, key, False, now)


def right(t: AuthThrottle, now: float = T0, addr: str = A) -> Verdict:
    return t.judge(addr, "the-key", True, now)


def test_new_wrong_keys_are_answered_late_after_the_free_ones_and_the_delay_doubles() -> None:
    t = AuthThrottle(after=3, first_s=1.0, max_s=8.0, max_pending=100)
    assert [wrong(t, f"g{i}") for i in range(3)] == [Reject(0.0)] * 3  # the free ones: at once
    delays = [wrong(t, f"h{i}") for i in range(6)]
    assert delays == [Reject(1.0), Reject(2.0), Reject(4.0), Reject(8.0), Reject(8.0), Reject(8.0)]
    assert wrong(t, "x", addr="10.0.0.2") == Reject(0.0)  # another address is not affected


def test_a_right_key_passes_at_once_while_wrong_ones_wait() -> None:
    t = AuthThrottle(after=1, first_s=30.0, max_s=300.0, max_pending=4)
    wrong(t, "free")
    for i in range(3):
        assert isinstance(wrong(t, f"g{i}"), Reject)
    assert t.pending(A, T0) == 3
    assert right(t) == Accept()  # not behind the three waiting 401s
    assert t.pending(A, T0) == 3 and t.blocked_total == 0  # and it changed nothing
    assert wrong(t, "g3") == Reject(240.0)  # a right key gives a guesser no fresh free tries


def test_repeats_of_a_wrong_key_and_missing_keys_cost_the_address_nothing() -> None:
    # A slave with an old key retrying once a second for an hour, next to clients with the key.
    t = AuthThrottle(after=2, first_s=1.0, max_s=300.0, max_pending=1)
    for second in range(3600):
        assert wrong(t, "old-key", T0 + second) == Reject(0.0)
        assert t.judge(A, None, False, T0 + second) == Reject(0.0)
        assert right(t, T0 + second) == Accept()
    assert t.pending(A, T0 + 3600) == 0 and t.blocked_total == 0
    assert wrong(t, "another") == Reject(0.0)  # only the second new wrong key: still free


def test_past_max_pending_any_new_key_is_refused_unseen_even_the_right_one() -> None:
    t = AuthThrottle(after=0, first_s=10.0, max_s=10.0, max_pending=4)
    for i in range(4):
        assert wrong(t, f"g{i}") == Reject(10.0)
    blocked = [wrong(t, f"p{i}", T0 + 1) for i in range(100)] + [right(t, T0 + 1)]
    # Not compared: the right key's answer is the wrong ones', so parallel guesses learn nothing.
    assert set(blocked) == {Blocked(9.0)} and t.blocked_total == 101
    assert wrong(t, "g0", T0 + 1) == Reject(0.0)  # a known wrong key is no guess: its 401 at once
    assert t.pending(A, T0 + 1) == 4  # the answers waiting never exceed max_pending
    assert right(t, T0 + 10) == Accept()  # the slots free as their 401s go out


def test_parallel_guessing_is_bounded_by_the_slots_and_the_delay() -> None:
    # An attacker keeping 1,000 guesses in flight for an hour, and waiting for no answer.
    t = AuthThrottle(after=10, first_s=1.0, max_s=300.0, max_pending=4)
    compared = 0
    for now in range(int(T0), int(T0) + 3600):
        for i in range(1000):
            if isinstance(wrong(t, f"{now}-{i}", float(now)), Reject):
                compared += 1
            else:
                break  # the rest of this second is refused the same way
    assert compared <= 10 + 9 + 4 * 12  # the module docstring's arithmetic: 67 in the first hour
    assert compared > 48


def test_the_count_is_forgotten_after_a_quiet_hour() -> None:
    t = AuthThrottle(after=1, first_s=1.0, max_s=10.0, max_pending=8, forget_s=3600.0)
    wrong(t, "a")
    assert wrong(t, "b") == Reject(1.0)
    assert wrong(t, "c", T0 + 1000) == Reject(2.0)  # quiet, but not for an hour
    assert wrong(t, "d", T0 + 1000 + 2 + 3601) == Reject(0.0)  # afresh: a free one again


def test_known_wrong_keys_are_the_last_few_only() -> None:
    t = AuthThrottle(after=3, first_s=1.0, max_s=1.0, remember=2)
    for key in ("a", "b", "c"):
        assert wrong(t, key) == Reject(0.0)
    assert wrong(t, "c") == wrong(t, "b") == Reject(0.0)  # known: no guess
    assert wrong(t, "a") == Reject(1.0)  # forgotten, so a new guess: the fourth


def test_ipv6_addresses_count_by_their_64_prefix_and_the_table_is_bounded() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_key("not an address") == "not an address"
    t = AuthThrottle(after=0, first_s=1.0, max_s=1.0, max_addresses=3, max_pending=1)
    for i in range(10):
        wrong(t, "x", addr=f"10.0.0.{i}")
    assert len(t) == 3
    assert isinstance(wrong(t, "y", addr="10.0.0.9"), Blocked)
    assert wrong(t, "y", addr="10.0.0.0") == Reject(1.0)  # forgotten: starts afresh
    wrong(t, "x", addr="2001:db8::1")
    assert isinstance(wrong(t, "z", addr="2001:db8::2"), Blocked)  # the same /64
    assert right(t, addr="10.0.0.5") == Accept() and len(t) == 3  # a right key adds no record
