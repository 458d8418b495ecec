"""``kapok cluster nodes --seed URL``: one node's gossip view, as a table or JSON."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["fetch_nodes", "nodes_table"]

_COLUMNS = ("name", "state", "incarnation", "role", "pair", "http_url", "gossip_addr", "version", "load")


def fetch_nodes(seed_url: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """``GET <seed_url>/cluster/nodes``; any failure is an ``OSError`` with one clear line."""
    url = seed_url.rstrip("/") + "/cluster/nodes"
    if not url.startswith(("http://", "https://")):
        raise OSError(f"--seed: expected an http(s) URL such as http://127.0.0.1:8011, got {seed_url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise OSError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"cannot reach {url}: {reason}") from None
    try:
        rows = json.loads(body)
    except ValueError:
        raise OSError(f"{url}: the answer is not JSON (is this a Kapok node?)") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise OSError(f"{url}: expected a JSON list of members (is this a Kapok node?)")
    return rows


def nodes_table(rows: list[dict[str, Any]]) -> str:
    """Aligned plain-text columns, one member per line, the answering node marked ``*``."""
    cells = [[*_COLUMNS]]
    for row in rows:
        line = ["-" if row.get(col) is None else str(row.get(col)) for col in _COLUMNS]
        if row.get("self"):
            line[0] += " *"
        cells.append(line)
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells)
    return "\n".join(lines)
