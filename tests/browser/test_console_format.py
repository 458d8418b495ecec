"""The live refresh (console.js) writes every figure exactly as the server render does
(kapok/console/format.py): both run on the same values here and must agree."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import Page

from kapok.console.format import css_class, fmt

pytestmark = pytest.mark.browser

CASES: list[tuple[Any, str]] = [
    (None, "num"), ("", "bytes"), (0, "num"), (7, "num"), (1234567, "num"), (3.14159, "num"), (2.0, "num"),
    (-1500, "num"), (True, ""), (False, "num"), ("unlimited", "bytes"), ("name", ""), (12, ""),
    (0, "bytes"), (1023, "bytes"), (1024, "bytes"), (1536, "bytes"), (10 * 1024**2 + 1, "bytes"),
    (3 * 1024**5, "bytes"),
    (0, "rate"), (0.04, "rate"), (1234.56, "rate"),
    (0, "time"), (1764000000, "time"), (1764000000.75, "time"),
    (0, "dur"), (3.26, "dur"), (59.9, "dur"), (61, "dur"), (3599, "dur"), (7200, "dur"), (200000, "dur"),
    (0.5, "ms"), (12345.67, "ms"),
]  # fmt: skip


def test_browser_and_server_format_alike(page: Page) -> None:
    cases = json.dumps(CASES)
    in_browser = page.evaluate(f"{cases}.map(([v, k]) => Kapok.fmt(v, k))")
    assert in_browser == [fmt(value, kind) for value, kind in CASES]
    classes = ["alive", True, False, "sus pect<", "é"]
    assert page.evaluate(f"{json.dumps(classes)}.map(Kapok.classPart)") == [css_class(v) for v in classes]
