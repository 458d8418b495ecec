"""Console sessions and the login throttle, on a manual clock."""

from __future__ import annotations

import pytest

from kapok.console import session as sess
from kapok.console.session import Sessions, safe_next
from kapok.testing.clock import ManualClock


def test_a_session_lives_while_used_and_ends_when_idle() -> None:
    clock = ManualClock()
    sessions = Sessions("node-a", idle_s=60, clock=clock.time)
    s = sessions.create()
    assert s.sid != s.csrf and len(s.sid) >= 40
    clock.advance(59)
    assert sessions.get(s.sid) is s
    clock.advance(59)
    assert sessions.get(s.sid) is s  # each use restarts the idle time
    clock.advance(61)
    assert sessions.get(s.sid) is None and len(sessions) == 0
    assert sessions.get("") is None and sessions.get(None) is None


def test_sessions_are_bounded_and_the_least_recently_used_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    sessions = Sessions("node-a", idle_s=3600, clock=clock.time)
    monkeypatch.setattr(sess, "MAX_SESSIONS", 3)
    a, b, c = sessions.create(), sessions.create(), sessions.create()
    assert sessions.get(a.sid) is a  # a is now the most recently used
    d = sessions.create()
    assert len(sessions) == 3
    assert sessions.get(b.sid) is None
    assert all(sessions.get(x.sid) is x for x in (a, c, d))


def test_cookie_names_differ_per_node() -> None:
    clock = ManualClock()
    one, two = Sessions("127.0.0.1:8011", 1, clock.time), Sessions("127.0.0.1:8012", 1, clock.time)
    assert one.cookie != two.cookie and one.cookie.startswith("kapok_console_")
    assert one.login_cookie != one.cookie


def test_logout_ends_a_session() -> None:
    sessions = Sessions("n", 60, ManualClock().time)
    s = sessions.create()
    sessions.end(s.sid)
    sessions.end("unknown")
    assert sessions.get(s.sid) is None


def test_only_console_paths_are_followed_after_login() -> None:
    assert safe_next("/console/topics?x=1") == "/console/topics?x=1"
    for bad in (None, "", "//evil.example/", "https://evil.example/console/", "/v1/topics", "/console/login"):
        assert safe_next(bad) == "/console/overview"
