"""Pure parts of the console's figures: value formats (pair cards: ``test_pairs.py``)."""

from __future__ import annotations

from kapok.console.format import css_class, fmt, pick


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
