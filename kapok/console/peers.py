"""The analytics summaries of the other cluster members, so that every node's Analytics page
shows the same (the newest) summary, whichever node's storage holds ``summary.json``.

Each node serves its own file (only its own: a node never passes on what it fetched) at
``SUMMARY_ROUTE``, to the secret key as a bearer token, which is how nodes speak to each
other (``/sync/v1``, ``/replication/state``). ``PeerSummaries`` asks every live member
that has an HTTP URL, all at once, each with a short time-out, and keeps each answer for
``CACHE_S``: page views and refreshes share one round of requests, however many there are,
and a member that joins is asked at the next page view.

A member without a summary, or answering 404 (a version without the route, or its console
turned off), is left out quietly; one that does not answer, answers with an error, with
more than ``limit`` bytes or with something that is not its summary is left out too, and
logged once per ``LOG_EVERY_S`` at most. Deciding whom to ask and what an answer means are
pure functions; the class only does the requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from kapok.console.analytics import Candidate, check_summary

__all__ = [
    "CACHE_S",
    "LOG_EVERY_S",
    "PEER_SUMMARIES",
    "SUMMARY_ROUTE",
    "TIMEOUT_S",
    "PeerSummaries",
    "decode_answer",
    "peer_targets",
]

SUMMARY_ROUTE: Final = "/console/api/analytics/summary"
CACHE_S: Final = 30.0  # a round of requests serves every page view for this long
TIMEOUT_S: Final = 2.0  # per member, the whole request: a page waits at most this long
LOG_EVERY_S: Final = 300.0  # one line per member at most this often
_LIVE: Final = ("alive", "suspect")

log = logging.getLogger("kapok.console")


def peer_targets(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(name, HTTP URL) of the live members to ask: not this node, and with a URL."""
    out = []
    for row in rows:
        url = row.get("http_url")
        if row.get("self") or row.get("state") not in _LIVE or not isinstance(url, str):
            continue
        if url.startswith(("http://", "https://")):
            out.append((str(row.get("name")), url.rstrip("/")))
    return sorted(out)


def decode_answer(raw: bytes, name: str) -> tuple[Candidate | None, str]:
    """A member's answer: its summary, or None and why not ("" when it simply has none)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, "answered with something that is not JSON"
    if not isinstance(body, dict) or body.get("node") != name:
        return None, "answered with something that is not its summary"
    summary, path = body.get("summary"), body.get("path")
    if summary is None:
        return None, ""  # it has none (or cannot read its own): nothing worth a log line
    problem = check_summary(summary)
    if problem or not isinstance(summary, dict):
        return None, f"answered with a summary that {problem or 'is missing'}"
    return Candidate(name, path if isinstance(path, str) else "", summary), ""


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None past ``limit`` bytes (read no further)."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    body = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


class PeerSummaries:
    """The members' summaries, each asked at most once per ``CACHE_S`` (``clock``: seconds)."""

    def __init__(self, secret_key: str, limit: int, clock: Callable[[], float]) -> None:
        self.secret_key = secret_key
        self.limit = limit
        self._clock = clock
        self._lock = asyncio.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Candidate | None]] = {}  # (name, url) ->
        self._logged: dict[str, float] = {}  # member -> when its last line was logged

    async def get(self, targets: Sequence[tuple[str, str]]) -> list[Candidate]:
        """The summaries of ``targets`` (name, URL) that answered: asks those not asked within
        ``CACHE_S`` (a member that just joined at once), all together, and keeps the answers."""
        async with self._lock:  # page views that come meanwhile wait for this round
            now = self._clock()
            self._cache = {t: got for t, got in self._cache.items() if now - got[0] < CACHE_S}
            due = [t for t in targets if t not in self._cache]
            if due:
                for target, candidate in zip(due, await self._fetch_all(due), strict=True):
                    self._cache[target] = (now, candidate)
            found = (self._cache[t][1] for t in targets)
            return [c for c in found if c is not None]

    async def _fetch_all(self, targets: Sequence[tuple[str, str]]) -> list[Candidate | None]:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self.secret_key}", "Accept": "application/json"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            answers = await asyncio.gather(*(self._fetch(http, name, url) for name, url in targets))
        for (name, _), (_, why) in zip(targets, answers, strict=True):
            if why:
                self._note(name, why)
        return [candidate for candidate, _ in answers]

    async def _fetch(self, http: aiohttp.ClientSession, name: str, url: str) -> tuple[Candidate | None, str]:
        """A member's summary, or None and why not ("": nothing worth a log line)."""
        try:
            async with http.get(url + SUMMARY_ROUTE, allow_redirects=False) as resp:
                if resp.status == 404:
                    return None, ""  # a version without the route, or its console is off
                if resp.status != 200:
                    return None, f"answered HTTP {resp.status}"
                raw = await _read_bounded(resp, self.limit)
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            return None, f"did not answer ({exc.__class__.__name__})"
        if raw is None:
            return None, f"answered with more than {self.limit} bytes"
        return await asyncio.to_thread(decode_answer, raw, name)  # a big one parses off the loop

    def _note(self, name: str, why: str) -> None:
        now = self._clock()
        last = self._logged.get(name)
        if last is None or now - last >= LOG_EVERY_S:
            self._logged[name] = now
            log.warning("analytics summary of member %s left out: it %s", name, why)


PEER_SUMMARIES: Final = web.AppKey("console_peer_summaries", PeerSummaries)
