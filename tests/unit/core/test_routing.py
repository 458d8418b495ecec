"""Routing-key patterns: exact keys, AMQP-style ``*`` and ``#``, and "every key"."""

from __future__ import annotations

import pytest

from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.routing import MAX_PATTERN_CHARS, KeyPattern, compile_pattern
from kapok.errors import BadRequestError, KapokError

# (pattern, key, matches)
CASES: list[tuple[str, str, bool]] = [
    # exact match (no wildcard words)
    ("orders", "orders", True),
    ("orders", "orders.eu", False),
    ("orders", "order", False),
    ("orders", "", False),
    ("a.b", "a.b", True),
    ("a.b", "a.b.c", False),
    ("a.b", "a", False),
    ("a*", "a*", True),  # '*' inside a word is not a wildcard
    ("a*", "ab", False),
    ("a#", "a#", True),
    ("a#", "abc", False),
    ("a.b", "aXb", False),  # the dot is literal, not a regex dot
    # '*' is exactly one (non-empty) word
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", "", False),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("*.b", "a.b", True),
    ("*.b", "b", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.x.c", False),
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    # '#' is zero or more words: at the end
    ("a.#", "a", True),
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "ab", False),
    ("a.#", "ab.c", False),
    # ... at the start
    ("#.z", "z", True),
    ("#.z", "a.z", True),
    ("#.z", "a.b.z", True),
    ("#.z", "z.a", False),
    ("#.z", "az", False),
    # ... in the middle
    ("a.#.z", "a.z", True),
    ("a.#.z", "a.b.z", True),
    ("a.#.z", "a.b.c.z", True),
    ("a.#.z", "a.b.c", False),
    ("a.#.z", "z", False),
    ("a.#.z", "a.zz", False),
    # '#' alone matches everything, the empty key included
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    # combinations
    ("*.#", "a", True),
    ("*.#", "a.b.c", True),
    ("*.#", "", False),
    ("#.*", "a", True),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("a.*.#", "a", False),
    # regex metacharacters in words are literal
    ("a+.(b)", "a+.(b)", True),
    ("a+.#", "aa.x", False),
    ("x|y.*", "x|y.q", True),
    ("x|y.*", "x.q", False),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), CASES)
def test_pattern_matches(pattern: str, key: str, expected: bool) -> None:
    compiled = compile_pattern(pattern)
    assert compiled is not None
    assert compiled.matches(key) is expected
    assert KeyPattern(pattern).matches(key) is expected
    assert compiled.source == pattern


@pytest.mark.parametrize("source", [None, ""])
def test_no_pattern_means_every_key(source: str | None) -> None:
    assert compile_pattern(source) is None


def test_consumer_without_pattern_accepts_everything() -> None:
    broker = Broker(Config.default().mq.settings())
    anything = broker.subscribe("t", now=0.0, key=None)
    empty = broker.subscribe("t", now=0.0, key="")
    exact = broker.subscribe("t", now=0.0, key="a.b")
    for key in ["", "a", "a.b", "x.y.z"]:
        assert anything.accepts(key)
        assert empty.accepts(key)
    assert exact.accepts("a.b")
    assert not exact.accepts("a.c")


@pytest.mark.parametrize("length", [MAX_PATTERN_CHARS + 1, 1000])
def test_too_long_pattern_is_rejected(length: int) -> None:
    with pytest.raises(BadRequestError) as info:
        compile_pattern("a" * length)
    assert isinstance(info.value, KapokError)
    assert str(MAX_PATTERN_CHARS) in str(info.value)


def test_longest_allowed_pattern_compiles() -> None:
    pattern = "a." * ((MAX_PATTERN_CHARS - 1) // 2) + "#"
    assert len(pattern) <= MAX_PATTERN_CHARS
    compiled = compile_pattern(pattern)
    assert compiled is not None
    assert compiled.matches("a." * ((MAX_PATTERN_CHARS - 1) // 2) + "x.y")


def test_compile_is_cached() -> None:
    assert compile_pattern("c.#") is compile_pattern("c.#")
