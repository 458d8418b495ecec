"""Routing-key patterns (pure).

A subscription may carry a key pattern. Without one it receives every key.
A pattern without wildcards matches one key exactly. Otherwise it is AMQP
topic style over dot-separated words: ``*`` is exactly one word and ``#`` is
zero or more words, so ``a.#`` matches ``a``, ``a.b`` and ``a.b.c``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kapok.errors import BadRequestError

__all__ = ["KeyPattern", "compile_pattern"]

MAX_PATTERN_CHARS = 255


class KeyPattern:
    """A compiled key pattern; ``matches(key)`` is the only operation."""

    __slots__ = ("_exact", "_regex", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        words = source.split(".")
        if "*" not in words and "#" not in words:
            self._exact: str | None = source
            self._regex: re.Pattern[str] | None = None
            return
        self._exact = None
        self._regex = re.compile(_to_regex(words))

    def matches(self, key: str) -> bool:
        if self._exact is not None:
            return key == self._exact
        assert self._regex is not None
        return self._regex.fullmatch("." + key) is not None

    def __repr__(self) -> str:
        return f"KeyPattern({self.source!r})"


def _to_regex(words: list[str]) -> str:
    # The key is matched with a dot in front ("." + key) so that every word,
    # the first included, owns its leading separator and "#" can vanish
    # together with it: "a.#" matches ".a" as well as ".a.b".
    parts = []
    for word in words:
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]+")
        else:
            parts.append(r"\." + re.escape(word))
    return "".join(parts)


@lru_cache(maxsize=1024)
def compile_pattern(source: str | None) -> KeyPattern | None:
    """Compile ``source``; ``None`` or ``""`` means "every key"."""
    if not source:
        return None
    if len(source) > MAX_PATTERN_CHARS:
        raise BadRequestError(f"key pattern longer than {MAX_PATTERN_CHARS} characters")
    return KeyPattern(source)
