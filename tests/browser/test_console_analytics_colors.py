"""The Analytics page's charts in Chromium: with 25 topics (more than the eight fixed
colours) every topic's line, dots and legend swatch have a colour of their own, the same
after a reload, and each stands out on the white card (3:1, WCAG's figure for graphics)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from kapok.console.analytics import last_days

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

TOPICS = [f"topic-{i:02d}" for i in range(25)]


def write_summary(console: Any) -> None:
    """A small summary of the shape the analytics job writes, in the node's storage
    (``storage.dir`` of the conftest's node: ``data0`` beside its work folder)."""
    days = last_days(time.time())
    folder = Path(console.node.workdir).parent / "data0" / "analytics"
    folder.mkdir(parents=True, exist_ok=True)
    latency = {"p50": 1, "p95": 2, "p99": 3}
    summary = {
        "generated_at": "2026-01-01T00:00:00Z",
        "topics": {t: {"published": 10 + i, "latency_ms": latency} for i, t in enumerate(TOPICS)},
        "days": [
            {"day": day, "topic": t, "published": 1 + i + d}
            for d, day in enumerate(days)
            for i, t in enumerate(TOPICS)
        ],
    }
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


def rgb(css: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"rgb\((\d+), (\d+), (\d+)\)", css)
    assert match, css
    r, g, b = (int(v) for v in match.groups())
    return r, g, b


def hex_rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def luminance(color: tuple[int, int, int]) -> float:
    """WCAG's relative luminance."""
    lin = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in color]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def growth_colors(page: Page) -> dict[str, list[str]]:
    """Per legend entry (a topic): the colours of its swatch, its line and its dots."""
    found: dict[str, list[str]] = page.evaluate(
        """() => {
          const chart = document.getElementById("growth-chart");
          const names = [...chart.querySelectorAll(".legend li")].map((li) => li.textContent);
          const swatches = [...chart.querySelectorAll(".legend .swatch")];
          const lines = [...chart.querySelectorAll("polyline.series")];
          const dots = [...chart.querySelectorAll("circle.dot")];
          const perLine = dots.length / lines.length;
          return Object.fromEntries(names.map((name, i) => [name, [
            getComputedStyle(swatches[i]).backgroundColor,
            getComputedStyle(lines[i]).stroke,
            ...dots.slice(i * perLine, (i + 1) * perLine).map((d) => getComputedStyle(d).fill),
          ]]));
        }"""
    )
    return found


def test_25_topics_get_25_distinct_colours_that_stay_put(page: Page, console: Any) -> None:
    write_summary(console)
    page.goto(console.url + "/console/analytics")
    expect(page.locator("#growth-chart polyline.series")).to_have_count(len(TOPICS))
    first = growth_colors(page)
    assert list(first) == TOPICS  # the legend lists the topics sorted
    for topic, colors in first.items():
        assert len(set(colors)) == 1, (topic, colors)  # swatch, line and dots agree
    shown = [colors[0] for colors in first.values()]
    assert len(set(shown)) == len(TOPICS), sorted(shown)
    card = luminance(rgb(page.evaluate("getComputedStyle(document.querySelector('.card')).backgroundColor")))
    for topic, colors in first.items():
        ratio = (card + 0.05) / (luminance(rgb(colors[0])) + 0.05)
        assert ratio >= 3.0, (topic, colors[0], ratio)
    page.reload()
    expect(page.locator("#growth-chart polyline.series")).to_have_count(len(TOPICS))
    assert growth_colors(page) == first
    console.screenshot(page, "analytics_25_topics")
    # Whatever the number of series: distinct, and 3:1 on the card.
    palettes: list[list[str]] = page.evaluate(
        "[1, 2, 7, 8, 9, 16, 40, 64, 300].map((n) => KapokCharts.palette(n))"
    )
    for colors in palettes:
        assert len(set(colors)) == len(colors), colors
        contrast = [(card + 0.05) / (luminance(hex_rgb(c)) + 0.05) for c in colors]
        assert min(contrast) >= 3.0, (colors, contrast)
