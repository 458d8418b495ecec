"""The stream source's side of a node's HTTP v1 API, over blocking keep-alive connections.

Blocking on purpose: the source runs in Spark's Python processes (the planner and the
tasks), which have no event loop. A node's error answer becomes the ``KapokError`` its
code names (``kapok.errors.error_for_code``); a node that cannot be reached, or that
drops the connection, a ``ConnectionLostError``.

``on_pair`` runs one call against a master pair: its active node first, then the pair's
other nodes, again and again with backoff (``kapok.client.backoff``) while the answers
say "not now" (a connection refused or lost, a 503 from a slave that has not yet taken
over or a master that is handing its role back), until a bound; then it fails with one
line naming the pair.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from kapok.client.backoff import backoff_delay
from kapok.errors import (
    AnalyticsError,
    ConnectionLostError,
    KapokError,
    RateLimitedError,
    UnavailableError,
    error_for_code,
)

__all__ = ["MAX_PULL", "NodeClient", "message_row", "on_pair"]

MAX_PULL: Final = 1000  # messages per pull request (the node's limit)
BACKOFF_BASE_S: Final = 0.1
BACKOFF_CAP_S: Final = 2.0
BACKOFF_MIN_S: Final = 0.02  # full jitter may draw ~0: no busy loop against a refusing node
# Worth trying again, maybe on the pair's other node: the node is down or not serving now.
RETRYABLE: Final = (ConnectionLostError, UnavailableError, RateLimitedError)

T = TypeVar("T")


def message_row(message: dict[str, Any]) -> tuple[Any, ...]:
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
        int(message.get("attempts", 0)),
        {str(k): str(v) for k, v in headers.items()},
    )


class NodeClient:
    def __init__(self, url: str, key: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AnalyticsError(f"the kapok source: a node's URL must be http(s)://host:port, got {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
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

    def cluster_nodes(self) -> list[Any]:
        """``GET /cluster/nodes``: every member the node knows (no key needed)."""
        _, body = self._request("GET", "/cluster/nodes")
        if not isinstance(body, list):
            raise KapokError("its cluster view is not a list of members (is this a Kapok node?)")
        return body

    def pull(
        self, topic: str, group: str, count: int, lease_s: float, claim: str, start: str = "latest"
    ) -> list[dict[str, Any]]:
        """Lease up to ``count`` (≤ ``MAX_PULL``) ready messages under ``claim`` without
        waiting; when entries are in flight under ``claim`` already, exactly those. A group
        this pull makes begins at ``start``: ``latest`` (what comes after) or ``earliest``
        (every live message of the topic)."""
        params: dict[str, Any] = {
            "group": group, "max": min(count, MAX_PULL), "wait": 0, "lease_s": lease_s, "claim": claim,
        }  # fmt: skip
        if start != "latest":
            params["start"] = start
        _, body = self._request("GET", f"/v1/topics/{quote(topic, safe='')}/messages?{urlencode(params)}")
        if body.get("claim") != claim:  # a node that predates claims would lease anew each time
            raise AnalyticsError(
                f"the kapok source: {self.url} does not support claims (a newer Kapok is needed)"
            )
        messages: list[dict[str, Any]] = body["messages"]
        return messages

    def ack_claim(self, topic: str, group: str, claim: str) -> int:
        """Settle every entry in flight under ``claim``; how many (0: none, or already settled)."""
        payload = {"group": group, "claim": claim}
        _, body = self._request("POST", f"/v1/topics/{quote(topic, safe='')}/ack", payload)
        return int(body.get("settled", 0))

    def release(self, topic: str, group: str, count: int) -> None:
        """Create ``group`` (a pull does), putting back at once what the pull brought."""
        query = urlencode({"group": group, "max": max(1, count), "wait": 0, "lease_s": 60})
        _, body = self._request("GET", f"/v1/topics/{quote(topic, safe='')}/messages?{query}")
        codes = [m["code"] for m in body.get("messages", [])]
        if codes:
            payload = {"group": group, "codes": codes, "requeue": True}
            self._request("POST", f"/v1/topics/{quote(topic, safe='')}/nack", payload)

    def topic_counts(self, topic: str, group: str) -> tuple[int | None, int]:
        """``group``'s ready count (None when the node has no such group, or no such topic
        yet) and the topic's live count (what ``earliest`` would give a new group)."""
        status, body = self._request("GET", f"/v1/topics/{quote(topic, safe='')}", missing_ok=True)
        if status == 404:
            return None, 0
        live = int(body.get("live", 0))
        for row in body.get("groups", []):
            if row.get("name") == group:
                return int(row.get("ready", 0)), live
        return None, live

    # -- transport ---------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = kind(self._host, self._port, timeout=self._timeout_s)
        return self._conn

    def _request(
        self, method: str, path: str, payload: Any = None, *, missing_ok: bool = False
    ) -> tuple[int, Any]:
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
                    raise ConnectionLostError(f"{self.url} closed the connection ({exc})") from exc
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise ConnectionLostError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from exc
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        if response.status == 404 and missing_ok:
            return 404, body
        if response.status >= 400:
            fields = body if isinstance(body, dict) else {}
            code = fields.get("error", "internal")
            message = fields.get("message") or raw[:200].decode(errors="replace")
            raise error_for_code(
                code if isinstance(code, str) else "internal",
                f"{self.url}: {method} {path.split('?')[0]}: HTTP {response.status} {message}",
            )
        return response.status, body


def on_pair(
    urls: Sequence[str],
    call: Callable[[NodeClient], T],
    *,
    key: str,
    timeout_s: float,
    bound_s: float,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
) -> T:
    """``call`` on the first of ``urls`` that serves it, round after round with backoff
    while they answer "not now", for up to ``bound_s``; then ``AnalyticsError`` (one line,
    naming ``what``). An answer that retrying cannot change (a bad request, a wrong key)
    fails at once."""
    if not urls:
        raise AnalyticsError(f"the kapok source: {what}: the pair has no node with an address")
    deadline = clock() + bound_s
    attempt = 0
    while True:
        last: KapokError | None = None
        for url in urls:
            try:
                with NodeClient(url, key, timeout_s) as node:
                    return call(node)
            except RETRYABLE as exc:
                last = exc
            except AnalyticsError:
                raise
            except KapokError as exc:
                raise AnalyticsError(f"the kapok source: {what}: {exc}") from None
        left = deadline - clock()
        if left <= 0:
            raise AnalyticsError(
                f"the kapok source: {what}: no node of the pair served it within {bound_s:g} s (last: {last})"
            )
        delay = backoff_delay(attempt, base_s=BACKOFF_BASE_S, cap_s=BACKOFF_CAP_S, rand=rand())
        sleep(min(left, max(BACKOFF_MIN_S, delay)))
        attempt += 1
