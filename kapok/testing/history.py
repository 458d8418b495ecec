"""What a fault test saw, and what it must conclude: Jepsen's history and checker, made small.

Clients record every publish with its outcome, and every delivery; the checker then
compares the two. The outcomes are Jepsen's three:

``ok``    the broker confirmed it: it must be delivered.
``fail``  the broker definitely did not take it (a refusal it answered): it must not be.
``info``  nobody knows (a timeout, a dropped connection): it may or may not be delivered.

Ids are whatever the test chose to tell messages apart: message codes, or payloads when
the outcome may be ``info`` (a publish that timed out has no code). An id published more
than once (a retry) counts as confirmed if any attempt was ``ok``, as unknown if none was
but one was ``info``, and as failed only if every attempt failed.

``HealthWatcher`` samples a safety invariant while the test runs: it polls every node's
``GET /health`` every 50 ms and notes each moment two nodes of one pair said they were
active, and the longest stretch in which none of a pair was. ``HealthLog`` is its pure part
(times are given to it), so the conclusions can be checked on made-up polls.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

__all__ = ["HealthLog", "HealthWatcher", "History", "Overlap", "Report", "WatchReport"]

Outcome = Literal["ok", "fail", "info"]
_RANK: dict[str, int] = {"fail": 0, "info": 1, "ok": 2}  # a retry's better outcome wins
_SHOWN = 10  # ids shown per list in a report's text


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """The checker's verdict. Lists of ids are sorted; ``valid`` is the at-least-once promise."""

    confirmed: int  # ids with an ok publish
    indeterminate: int  # ids with an info publish and no ok one
    failed: int  # ids whose every publish failed
    delivered: int  # distinct ids delivered
    lost: tuple[str, ...]  # confirmed, never delivered
    duplicates: Mapping[str, int]  # id -> times delivered, for ids delivered more than once
    unexpected: tuple[str, ...]  # delivered, never published
    resurrected: tuple[str, ...]  # delivered, though every publish of it failed
    recovered: int  # indeterminate ids that were delivered after all

    @property
    def valid(self) -> bool:
        """Nothing confirmed was lost and nothing delivered came from nowhere (duplicates are
        allowed: delivery is at least once)."""
        return not (self.lost or self.unexpected or self.resurrected)

    @property
    def extra_deliveries(self) -> int:
        return sum(self.duplicates.values()) - len(self.duplicates)

    def __str__(self) -> str:
        def some(ids: Sequence[str]) -> str:
            more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
            return f"{len(ids)} {list(ids[:_SHOWN])}{more}"

        return (
            f"confirmed {self.confirmed}, indeterminate {self.indeterminate} ({self.recovered} delivered), "
            f"failed {self.failed}, delivered {self.delivered}; lost {some(self.lost)}; "
            f"duplicated {some(sorted(self.duplicates))} ({self.extra_deliveries} extra deliveries); "
            f"unexpected {some(self.unexpected)}; resurrected {some(self.resurrected)}"
        )


class History:
    """Publishes and deliveries as clients report them; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: dict[str, Outcome] = {}
        self._delivered: Counter[str] = Counter()

    def published(self, outcome: Outcome, *ids: str) -> None:
        """Record one publish of each id (a batch shares its outcome)."""
        if outcome not in _RANK:
            raise ValueError(f"outcome must be ok, fail or info, not {outcome!r}")
        with self._lock:
            for id_ in ids:
                before = self._published.get(id_)
                if before is None or _RANK[outcome] > _RANK[before]:
                    self._published[id_] = outcome

    def delivered(self, *ids: str) -> None:
        """Record one delivery of each id (each time a consumer receives it)."""
        with self._lock:
            self._delivered.update(ids)

    def check(self) -> Report:
        with self._lock:
            published = dict(self._published)
            delivered = Counter(self._delivered)
        by_outcome: dict[str, set[str]] = {"ok": set(), "fail": set(), "info": set()}
        for id_, outcome in published.items():
            by_outcome[outcome].add(id_)
        return Report(
            confirmed=len(by_outcome["ok"]),
            indeterminate=len(by_outcome["info"]),
            failed=len(by_outcome["fail"]),
            delivered=len(delivered),
            lost=tuple(sorted(by_outcome["ok"] - delivered.keys())),
            duplicates=types.MappingProxyType({id_: n for id_, n in sorted(delivered.items()) if n > 1}),
            unexpected=tuple(sorted(delivered.keys() - published.keys())),
            resurrected=tuple(sorted(by_outcome["fail"] & delivered.keys())),
            recovered=len(by_outcome["info"] & delivered.keys()),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Overlap:
    """A poll in which more than one node of a pair said it was active."""

    at_s: float  # seconds since the watch began
    pair: int  # index of the pair, in the order given
    active: tuple[str, ...]  # the URLs that said so
    epochs: tuple[int | None, ...]  # the epoch each of them gave


@dataclasses.dataclass(frozen=True, slots=True)
class WatchReport:
    polls: int  # rounds made (each asks every node once)
    overlaps: tuple[Overlap, ...]  # the first ``HealthLog.MAX_OVERLAPS`` of them
    overlap_count: int  # all of them
    longest_gap_s: tuple[float, ...]  # per pair: longest time with no node of it active
    answered: Mapping[str, int]  # per URL: polls it answered
    last: Mapping[str, Mapping[str, Any] | None]  # per URL: its last answer (None: none)


class HealthLog:
    """Conclusions from polls of /health, fed by ``observe``; no clock, no I/O.

    A gap runs from the last poll that saw an active node of the pair to the next one that
    does, and is counted only if some poll in between saw none: the true gap is shorter by
    up to one poll period, so an assertion on it errs on the safe side. A node that did not
    answer counts as not active. Before the first active poll, a gap runs from ``start_s``.
    """

    MAX_OVERLAPS = 1000

    def __init__(self, pairs: Sequence[Sequence[str]], start_s: float = 0.0) -> None:
        if not pairs or not all(pairs):
            raise ValueError("give at least one pair, each of at least one URL")
        self.pairs = [tuple(pair) for pair in pairs]
        self.urls = list(dict.fromkeys(url for pair in self.pairs for url in pair))
        self._polls = 0
        self._overlaps: list[Overlap] = []
        self._overlap_count = 0
        self._now = start_s
        self._last_active = [start_s] * len(self.pairs)
        self._in_gap = [False] * len(self.pairs)
        self._longest = [0.0] * len(self.pairs)
        self._answered = dict.fromkeys(self.urls, 0)
        self._last: dict[str, Mapping[str, Any] | None] = dict.fromkeys(self.urls)

    def observe(self, at_s: float, health: Mapping[str, Mapping[str, Any] | None]) -> None:
        """One round: each URL's /health body, or None if it did not answer in time."""
        self._polls += 1
        self._now = at_s
        for url in self.urls:
            answer = health.get(url)
            self._last[url] = answer
            if answer is not None:
                self._answered[url] += 1
        for i, pair in enumerate(self.pairs):
            active = [url for url in pair if (health.get(url) or {}).get("active") is True]
            if len(active) > 1:
                self._overlap_count += 1
                if len(self._overlaps) < self.MAX_OVERLAPS:
                    epochs = tuple((health.get(url) or {}).get("epoch") for url in active)
                    self._overlaps.append(Overlap(at_s, i, tuple(active), epochs))
            if not active:
                self._in_gap[i] = True
                continue
            if self._in_gap[i]:
                self._longest[i] = max(self._longest[i], at_s - self._last_active[i])
                self._in_gap[i] = False
            self._last_active[i] = at_s

    def report(self) -> WatchReport:
        """So far; a gap still open counts up to the last poll."""
        gaps = tuple(
            max(longest, self._now - last) if in_gap else longest
            for longest, last, in_gap in zip(self._longest, self._last_active, self._in_gap, strict=True)
        )
        return WatchReport(
            polls=self._polls,
            overlaps=tuple(self._overlaps),
            overlap_count=self._overlap_count,
            longest_gap_s=gaps,
            answered=types.MappingProxyType(dict(self._answered)),
            last=types.MappingProxyType(dict(self._last)),
        )


class HealthWatcher:
    """Polls every node of ``pairs`` (lists of base URLs) from a daemon thread while a test runs.

    A round asks all nodes at once (a thread per node), each with ``timeout_s``, so one node
    stopped with SIGSTOP slows a round to ``timeout_s`` but hides no other node; rounds start
    every ``interval_s`` (at once after a slow one). Environment proxies are ignored.
    """

    def __init__(
        self, pairs: Sequence[Sequence[str]], *, interval_s: float = 0.05, timeout_s: float = 0.25
    ) -> None:
        self._log = HealthLog(pairs)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watcher", daemon=True)

    def start(self) -> HealthWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0 + self.timeout_s)

    def __enter__(self) -> HealthWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def report(self) -> WatchReport:
        with self._lock:
            return self._log.report()

    def _health(self, url: str) -> Mapping[str, Any] | None:
        try:
            with self._opener.open(url + "/health", timeout=self.timeout_s) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):  # refused, reset, timed out, an HTTP error, not JSON
            return None
        return body if isinstance(body, dict) else None

    def _run(self) -> None:
        urls = self._log.urls
        start = next_at = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(urls), thread_name_prefix="health-poll") as pool:
            while not self._stop.is_set():
                at_s = time.monotonic() - start
                health = dict(zip(urls, pool.map(self._health, urls), strict=True))
                with self._lock:
                    self._log.observe(at_s, health)
                next_at = max(next_at + self.interval_s, time.monotonic())
                self._stop.wait(max(0.0, next_at - time.monotonic()))
