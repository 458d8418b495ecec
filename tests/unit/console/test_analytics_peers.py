"""Which summary a node shows when several members hold one, whom it asks, and what an
answer means: the pure parts of ``kapok.console.peers`` and ``analytics.newest``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from kapok.console.analytics import Candidate, check_summary, generated_seconds, newest
from kapok.console.peers import decode_answer, peer_targets

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (T0, T0),
        (int(T0), T0),
        ("2026-03-10T12:00:00Z", T0),
        ("2026-03-10T13:00:00+01:00", T0),
        ("2026-03-10T12:00:00", T0),  # no zone: UTC, as the job writes
        ("yesterday", None),
        (None, None),
        (True, None),
        (float("nan"), None),
        ({"at": 1}, None),
    ],
)
def test_generated_at_as_seconds(value: Any, seconds: float | None) -> None:
    assert generated_seconds(value) == seconds


def candidate(node: str, generated_at: Any) -> Candidate:
    return Candidate(node, f"/{node}/summary.json", {"generated_at": generated_at, "topics": {}})


def test_the_newest_summary_wins_and_a_tie_keeps_the_first() -> None:
    own = candidate("me", "2026-03-10T12:00:00Z")
    older, newer = candidate("old", T0 - 60), candidate("new", T0 + 60)
    assert newest([own, older, newer]) is newer
    assert newest([own, candidate("same", T0)]) is own
    assert newest([candidate("undated", None), older]) is older  # a date beats none
    undated = candidate("undated", "garbage")
    assert newest([undated, candidate("also", None)]) is undated
    assert newest([]) is None


def test_a_summary_needs_a_topics_object_only() -> None:
    assert check_summary({"topics": {}, "new_key": [1]}) == ""
    assert check_summary({}) == ""  # no topics yet: an empty summary
    assert "topics" in check_summary({"topics": []})
    assert "topics" in check_summary([1, 2])


def test_the_members_asked_are_the_live_others_with_a_url() -> None:
    rows = [
        {"name": "me", "self": True, "state": "alive", "http_url": "http://127.0.0.1:1"},
        {"name": "b", "self": False, "state": "alive", "http_url": "http://127.0.0.1:3/"},
        {"name": "a", "self": False, "state": "suspect", "http_url": "https://a.example:2"},
        {"name": "dead", "self": False, "state": "dead", "http_url": "http://127.0.0.1:4"},
        {"name": "left", "self": False, "state": "left", "http_url": "http://127.0.0.1:5"},
        {"name": "nourl", "self": False, "state": "alive", "http_url": ""},
        {"name": "odd", "self": False, "state": "alive", "http_url": "file:///etc/passwd"},
    ]
    assert peer_targets(rows) == [("a", "https://a.example:2"), ("b", "http://127.0.0.1:3")]


def answer(body: Any) -> bytes:
    return orjson.dumps(body)


def test_an_answer_is_a_summary_of_the_member_asked_or_left_out() -> None:
    summary = {"generated_at": T0, "topics": {"t": {"published": 1}}, "histograms": {"later": 1}}
    got, why = decode_answer(answer({"node": "b", "path": "/d/summary.json", "summary": summary}), "b")
    assert got == Candidate("b", "/d/summary.json", summary) and why == ""  # unknown keys kept, ignored
    assert decode_answer(answer({"node": "b", "summary": None}), "b") == (None, "")  # none: quiet
    cases = {
        b"<html>": "not JSON",
        answer([1]): "not its summary",
        answer({"node": "c", "summary": summary}): "not its summary",
        answer({"node": "b", "summary": {"topics": 3}}): "no 'topics' object",
        answer({"node": "b", "summary": "text"}): "no 'topics' object",
    }
    for raw, reason in cases.items():
        got, why = decode_answer(raw, "b")
        assert got is None and reason in why, (raw, why)
