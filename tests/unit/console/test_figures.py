"""Pure parts of the console's figures: master/slave pairing and value formats."""

from __future__ import annotations

from typing import Any

from kapok.console.figures import pair_rows
from kapok.console.format import css_class, fmt, pick


def member(name: str, role: str = "master", pair: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "role": role, "pair": pair, "epoch": 0, **extra}


def test_members_are_paired_by_their_pair_field() -> None:
    lag = {"records": 3, "bytes": 300, "seconds": 0.5}
    rows = [
        member("s1", "slave", "m1", epoch=4, lag=lag),
        member("m2"),
        member("m1", "master", "s1", epoch=3),
        member("s9", "slave", "gone"),  # its master is not in the view
    ]
    pairs = pair_rows(rows)
    shape = [(p["master"] and p["master"]["name"], p["slave"] and p["slave"]["name"]) for p in pairs]
    assert shape == [("m1", "s1"), ("m2", None), (None, "s9")]
    assert pairs[0]["epoch"] == 4 and pairs[0]["lag"] == lag
    assert pairs[1]["lag"] is None and pairs[1]["epoch"] == 0


def test_a_pair_field_naming_a_member_of_the_same_role_pairs_nothing() -> None:
    pairs = pair_rows([member("a", pair="b"), member("b", pair="a")])
    assert [(p["master"]["name"], p["slave"]) for p in pairs] == [("a", None), ("b", None)]


def test_formats() -> None:
    assert fmt(None, "num") == "—" and fmt("", "bytes") == "—" and fmt(float("nan"), "num") == "—"
    assert fmt(True) == "yes" and fmt(False, "num") == "no"
    assert fmt(1234567, "num") == "1,234,567" and fmt(2.5, "num") == "2.50" and fmt(2.0, "num") == "2"
    assert fmt(1536, "bytes") == "1.5 KiB" and fmt(512, "bytes") == "512 B"
    assert fmt("unlimited", "bytes") == "unlimited"
    assert fmt(0.3, "rate") == "0.3/s" and fmt(1234.5, "rate") == "1,234.5/s"
    assert fmt(3725, "dur") == "1 h 2 min" and fmt(4.3, "dur") == "4.3 s" and fmt(75, "dur") == "1 min 15 s"
    assert fmt(0, "time") == "—" and fmt(1764000000, "time") == "2025-11-24 16:00:00"
    assert pick({"a": {"b": 1}}, "a.b") == 1 and pick({"a": 1}, "a.b") is None
    assert css_class(True) == "yes" and css_class("sus pect<") == "suspect"
