"""``AuthThrottle``: per-address back-off after wrong keys (pure, time is an argument)."""

from __future__ import annotations

from kapok.server.throttle import AuthThrottle, address_key

T0 = 1000.0


def test_waits_start_after_the_allowed_failures_and_double() -> None:
    t = AuthThrottle(after=3, first_s=1.0, max_s=8.0)
    for _ in range(2):
        t.failed("10.0.0.1", T0)
        assert t.wait_s("10.0.0.1", T0) == 0
    t.failed("10.0.0.1", T0)  # the third: one second
    assert t.wait_s("10.0.0.1", T0) == 1.0
    assert t.wait_s("10.0.0.2", T0) == 0  # another address is not affected
    waits = []
    now = T0
    for _ in range(5):
        now += t.wait_s("10.0.0.1", now)
        t.failed("10.0.0.1", now)
        waits.append(t.wait_s("10.0.0.1", now))
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0]  # capped at max_s
    assert t.blocked_total >= 6


def test_a_right_key_or_a_long_quiet_forgets_the_address() -> None:
    t = AuthThrottle(after=2, first_s=1.0, max_s=10.0)
    t.failed("a", T0)
    t.failed("a", T0)
    assert t.wait_s("a", T0) > 0
    t.succeeded("a")
    assert t.wait_s("a", T0) == 0 and len(t) == 0
    t.failed("b", T0)
    t.failed("b", T0)  # waits until T0 + 1
    t.failed("b", T0 + 12)  # quiet for more than max_s after that wait: counted afresh
    assert t.wait_s("b", T0 + 12) == 0


def test_ipv6_addresses_count_by_their_64_prefix_and_the_table_is_bounded() -> None:
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert address_key("not an address") == "not an address"
    t = AuthThrottle(after=1, first_s=1.0, max_s=1.0, max_addresses=3)
    for i in range(10):
        t.failed(f"10.0.0.{i}", T0)
    assert len(t) == 3
    assert t.wait_s("10.0.0.9", T0) > 0 and t.wait_s("10.0.0.0", T0) == 0
