"""How the pages write numbers, sizes, rates, times and durations (Jinja2 filters).

``view/static/console.js`` has the same formats (``FORMATS`` there) for the live refresh;
``tests/browser/test_console_format.py`` runs both on the same values and compares. A
missing value (None, "") is written "—" everywhere, a boolean "yes" or "no".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

__all__ = ["FILTERS", "css_class", "fmt", "pick"]

DASH: Final = "—"
_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB")


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and not math.isfinite(value))


def fmt_num(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def fmt_bytes(value: Any) -> str:
    size = float(value)
    for unit in _UNITS:
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return DASH  # unreachable: the loop returns at the last unit


def fmt_rate(value: Any) -> str:
    return f"{float(value):,.1f}/s"


def fmt_time(value: Any) -> str:
    if not value:
        return DASH
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_dur(value: Any) -> str:
    seconds = int(float(value))
    if seconds < 60:
        return f"{float(value):.1f} s" if float(value) < 10 else f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s} s"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {m} min"
    return f"{hours // 24} d {hours % 24} h"


def fmt_ms(value: Any) -> str:
    return f"{float(value):,.1f} ms"


_BY_NAME: Final[dict[str, Callable[[Any], str]]] = {
    "num": fmt_num,
    "bytes": fmt_bytes,
    "rate": fmt_rate,
    "time": fmt_time,
    "dur": fmt_dur,
    "ms": fmt_ms,
    "": str,
}


def fmt(value: Any, kind: str = "") -> str:
    """``value`` written as ``kind`` (one of the names above); None and "" are "—"."""
    if _missing(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return str(value)  # "unlimited", a name: the formats are for numbers
    return _BY_NAME[kind](value)


def pick(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]`` for the path ``a.b``; None where a part is missing."""
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def css_class(value: Any) -> str:
    """The part after ``is-`` of a state's class name (as ``classPart`` in console.js)."""
    text = ("yes" if value else "no") if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9_]", "", text)


FILTERS: Final[dict[str, Callable[..., Any]]] = {"fmt": fmt, "pick": pick, "cls": css_class}
