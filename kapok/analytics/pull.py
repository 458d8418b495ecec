"""The stream source's side of a node's HTTP v1 pull API, over one blocking keep-alive connection.

Blocking on purpose: the source runs in Spark's Python processes (the planner and the
tasks), which have no event loop. A node's error answer becomes the ``KapokError``
its code names (``kapok.errors.error_for_code``); a node that cannot be reached, an
``AnalyticsError``.
"""

from __future__ import annotations

import base64
import http.client
import json
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

from kapok.errors import AnalyticsError, error_for_code

__all__ = ["MAX_ACK", "MAX_PULL", "NodeClient", "message_row"]

MAX_PULL: Final = 1000  # messages per pull request (the node's limit)
MAX_ACK: Final = 10_000  # codes per ack request (the node's limit)


def message_row(message: dict[str, Any], attempts: int | None = None) -> tuple[Any, ...]:
    """A message of the v1 API as a row of ``kapok.analytics.stream.SCHEMA``."""
    text = message.get("data", "")
    data = base64.b64decode(text) if message.get("enc") == "base64" else str(text).encode()
    headers = message.get("headers") or {}
    return (
        message["code"],
        message["topic"],
        message.get("key", ""),
        int(message.get("priority", 0)),
        data,
        datetime.fromtimestamp(float(message["create_time"]), UTC),
        int(message.get("attempts", 0) if attempts is None else attempts),
        {str(k): str(v) for k, v in headers.items()},
    )


class NodeClient:
    def __init__(self, url: str, key: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AnalyticsError(f"the kapok source: url must be http(s)://host:port, got {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self._conn: http.client.HTTPConnection | None = None

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the API -----------------------------------------------------------------------

    def pull(self, topic: str, group: str, count: int, lease_s: float) -> list[dict[str, Any]]:
        """Lease up to ``count`` (≤ ``MAX_PULL``) ready messages without waiting."""
        query = urlencode({"group": group, "max": min(count, MAX_PULL), "wait": 0, "lease_s": lease_s})
        _, body = self._request("GET", f"/v1/topics/{quote(topic, safe='')}/messages?{query}")
        messages: list[dict[str, Any]] = body["messages"]
        return messages

    def ack(self, topic: str, group: str, codes: list[str]) -> list[str]:
        """Ack ``codes`` in ``group``; returns those that were not leased (any more)."""
        unknown: list[str] = []
        for i in range(0, len(codes), MAX_ACK):
            payload = {"group": group, "codes": codes[i : i + MAX_ACK]}
            _, body = self._request("POST", f"/v1/topics/{quote(topic, safe='')}/ack", payload)
            unknown.extend(body["unknown"])
        return unknown

    def ready_count(self, topic: str, group: str) -> int | None:
        """How many messages ``group`` has ready; None when the node has no such group (yet)."""
        status, body = self._request("GET", f"/v1/topics/{quote(topic, safe='')}", missing_ok=True)
        if status == 404:
            return None
        for row in body.get("groups", []):
            if row.get("name") == group:
                return int(row.get("ready", 0))
        return None

    def message_row(self, code: str, group: str) -> tuple[Any, ...] | None:
        """One message by code as a row (None when the node no longer has it)."""
        status, body = self._request("GET", f"/v1/messages/{quote(code, safe='')}", missing_ok=True)
        if status == 404:
            return None
        attempts = body.get("groups", {}).get(group, {}).get("attempts", 0)
        return message_row(body, attempts)

    # -- transport ---------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout_s)
        return self._conn

    def _request(
        self, method: str, path: str, payload: Any = None, *, missing_ok: bool = False
    ) -> tuple[int, dict[str, Any]]:
        data = None if payload is None else json.dumps(payload).encode()
        for attempt in (1, 2):  # once more on a fresh connection if the kept one was closed
            conn = self._connection()
            try:
                conn.request(method, self._prefix + path, body=data, headers=self._headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self.close()
                if attempt == 2:
                    raise AnalyticsError(
                        f"the kapok source: {self.url} closed the connection ({exc})"
                    ) from exc
            except OSError as exc:
                self.close()
                raise AnalyticsError(f"the kapok source: cannot reach {self.url}: {exc}") from exc
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        if response.status == 404 and missing_ok:
            return 404, body
        if response.status >= 400:
            code = body.get("error", "internal") if isinstance(body, dict) else "internal"
            message = (
                body.get("message", raw[:200].decode(errors="replace")) if isinstance(body, dict) else ""
            )
            raise error_for_code(code, f"{self.url}: {method} {path.split('?')[0]}: {message}")
        return response.status, body
