"""``kapok cluster nodes --seed URL``: one node's gossip view, as a table or JSON; and the
one small HTTP helper the operator commands share."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["fetch_json", "fetch_nodes", "nodes_table"]

_COLUMNS = (
    "name", "state", "incarnation", "role", "active", "pair", "epoch",
    "http_url", "gossip_addr", "version", "load",
)  # fmt: skip


def fetch_json(
    base_url: str, path: str, *, method: str = "GET", key: str | None = None, timeout_s: float = 5.0
) -> Any:
    """``<method> <base_url><path>`` (with the secret key when given) and its JSON answer;
    any failure is an ``OSError`` with one clear line (the node's own error message when
    it sent one)."""
    url = base_url.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        raise OSError(f"expected an http(s) URL such as http://127.0.0.1:8011, got {base_url!r}")
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(
        url, method=method, headers=headers, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("message", "")
        except (ValueError, AttributeError):
            message = ""
        raise OSError(f"{url}: HTTP {exc.code}{': ' + message if message else ''}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise OSError(f"cannot reach {url}: {reason}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise OSError(f"{url}: the answer is not JSON (is this a Kapok node?)") from None


def fetch_nodes(seed_url: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """``GET <seed_url>/cluster/nodes``; any failure is an ``OSError`` with one clear line."""
    rows = fetch_json(seed_url, "/cluster/nodes", timeout_s=timeout_s)
    url = seed_url.rstrip("/") + "/cluster/nodes"
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
