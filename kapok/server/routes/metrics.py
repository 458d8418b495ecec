"""Prometheus metrics, read from the service at scrape time, at a cost bounded whatever the
number of topics and of scrapers.

Nothing is counted twice on the hot path: the broker keeps plain integer counters, and a
scrape turns them into text. That text grows with the topics, so a scrape is built in
three steps, and only the cheap ones run on the event loop:

* on the loop, the node-wide families (the registry's collectors: a few dozen series
  whatever the load) and a snapshot of the per-topic numbers as plain tuples
  (``snapshot_topics``): the ``metrics.max_topics`` topics with the most live messages
  (ties by name) keep series of their own, the others are summed into one series labelled
  ``topic="(other topics)"`` (a name with a space: no topic can have it) and counted by
  ``kapok_metrics_topics_folded``;
* in a worker thread, the text (``prometheus_client.generate_latest``) from those;
* the body is then served again to every scrape for ``MAX_AGE_S``, and scrapes that come
  while a render runs wait for that one (single flight): at most one render a second,
  however many scrapers poll. The text of fewer than ``CACHED_FROM_ROWS`` topics and groups
  (a node with few topics) is not reused: it costs what any small request costs, and its
  numbers are always current (by the count, not by a measured cost, so that whether a
  scrape is current never depends on how busy the machine is).
  ``kapok_metrics_renders_total`` counts the renders.

Serving a reused body still costs its bytes (about a millisecond of the loop for 0.3 MB),
so scrapes share a pace (``Pacer``), each waiting its turn and answered 429 once its wait
would pass the pace's bound: those without the key ``ANONYMOUS_SCRAPES_PER_S`` a second,
all of them together, waiting at most ``ANONYMOUS_WAIT_S``; those with the key
(``Authorization: Bearer <mq.secret_key>``, what Prometheus sends with ``authorization:
{credentials: ...}``) a pace of their own, ``KEYED_SCRAPES_PER_S``, waiting at most
``KEYED_WAIT_S``. So a client without the key never stops one with it, and even scrapers
with it, polling as fast as they are answered, take a bounded share of the loop (a
Prometheus server scrapes once every few seconds). A bearer token, when sent, is checked
like every other key (wrong keys are throttled); with ``metrics.require_key`` the key is
needed. A refused scrape never renders.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import math
import time
from collections.abc import Iterable, Iterator, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.core.topics import Group, Topic
from kapok.errors import AuthError, RateLimitedError
from kapok.server import aiohttp_seam
from kapok.server.guard.auth import bearer_token, check_key
from kapok.server.guard.clients import Clients
from kapok.server.keys import REGISTRY, SERVICE
from kapok.service import BrokerService

__all__ = [
    "ALL_GROUPS",
    "ANONYMOUS_SCRAPES_PER_S",
    "ANONYMOUS_WAIT_S",
    "CACHED_FROM_ROWS",
    "KEYED_SCRAPES_PER_S",
    "KEYED_WAIT_S",
    "MAX_AGE_S",
    "OTHER_TOPICS",
    "MetricsRegistry",
    "Pacer",
    "RenderCache",
    "TopicRow",
    "TopicSnapshot",
    "make_registry",
    "routes",
    "snapshot_topics",
]

routes = web.RouteTableDef()

MAX_AGE_S = 1.0  # a rendered body is served again for this long: at most one render a second
CACHED_FROM_ROWS = 100  # topics and groups: text of fewer is made afresh for each scrape (a few ms)
OTHER_TOPICS = "(other topics)"  # the folded topics' label: a space, so never a topic's name
ALL_GROUPS = "(all groups)"  # the group label of the folded topics' summed group series
ANONYMOUS_SCRAPES_PER_S = 10.0  # scrapes without the key served a second, all of them together
ANONYMOUS_WAIT_S = 2.0  # the longest such a scrape waits for its turn; past it, 429
KEYED_SCRAPES_PER_S = 20.0  # scrapes with the key served a second, all of them together
KEYED_WAIT_S = 5.0  # the longest such a scrape waits (Prometheus gives a scrape 10 s)

_COUNTERS = {
    "published": "Messages accepted from producers (duplicates excluded)",
    "duplicates": "Publishes answered from the duplicate filter",
    "delivered": "Deliveries to consumers, redeliveries included",
    "redelivered": "Deliveries after the first for a group",
    "acked": "Messages acknowledged",
    "nacked": "Negative acknowledgements",
    "timeouts": "Ack deadlines that passed",
    "dead_lettered": "Entries moved to a dead-letter topic",
    "expired": "Messages whose TTL passed",
    "dropped": "Messages dropped by the drop_oldest overflow policy",
    "deleted": "Messages deleted from the console or API",
    "unrouted": "Messages published with no group to receive them",
}


# ---------------------------------------------------------------- the per-topic snapshot


@dataclasses.dataclass(frozen=True, slots=True)
class TopicRow:
    """One topic's numbers; ``groups`` holds (group, ready, inflight, consumers)."""

    name: str
    live: int
    live_bytes: int
    delayed: int
    groups: tuple[tuple[str, int, int, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSnapshot:
    """The topics with series of their own (by name), the others summed as one row, and
    how many those are."""

    rows: tuple[TopicRow, ...]
    other: TopicRow | None
    folded: int


def _group(group: Group) -> tuple[str, int, int, int]:
    if not group.consumers:  # most groups of most topics: no generator to run
        return group.name, group.ready_count, 0, 0
    return group.name, group.ready_count, group.inflight_count(), group.consumer_count()


def _row(topic: Topic) -> TopicRow:
    groups = tuple(_group(g) for g in topic.groups.values())
    return TopicRow(topic.name, topic.live_count, topic.live_bytes, topic.delayed_count, groups)


def snapshot_topics(topics: Sequence[Topic], limit: int) -> TopicSnapshot:
    """The ``limit`` topics with the most live messages (ties by name) row by row; the
    others summed into one ``OTHER_TOPICS`` row whose one group sums all their groups."""
    if len(topics) <= limit:
        return TopicSnapshot(tuple(sorted((_row(t) for t in topics), key=lambda r: r.name)), None, 0)
    kept = heapq.nsmallest(limit, topics, key=lambda t: (-t.live_count, t.name))
    ids = {id(t) for t in kept}
    live = live_bytes = delayed = ready = inflight = consumers = 0
    for topic in topics:
        if id(topic) in ids:
            continue
        live += topic.live_count
        live_bytes += topic.live_bytes
        delayed += topic.delayed_count
        for group in topic.groups.values():
            ready += group.ready_count
            if group.consumers:
                inflight += group.inflight_count()
                consumers += group.consumer_count()
    other = TopicRow(OTHER_TOPICS, live, live_bytes, delayed, ((ALL_GROUPS, ready, inflight, consumers),))
    rows = tuple(sorted((_row(t) for t in kept), key=lambda r: r.name))
    return TopicSnapshot(rows, other, len(topics) - len(kept))


def topic_families(snapshot: TopicSnapshot) -> list[Metric]:
    """The per-topic metric families of a snapshot (runs in the render thread)."""
    pair = ["topic", "group"]
    ready = GaugeMetricFamily("kapok_group_ready", "Ready messages per group", labels=pair)
    inflight = GaugeMetricFamily("kapok_group_inflight", "Unacked deliveries per group", labels=pair)
    consumers = GaugeMetricFamily("kapok_group_consumers", "Consumers per group", labels=pair)
    live = GaugeMetricFamily("kapok_topic_live", "Unfinished messages per topic", labels=["topic"])
    live_bytes = GaugeMetricFamily(
        "kapok_topic_live_bytes", "Payload bytes of unfinished messages", labels=["topic"]
    )
    delayed = GaugeMetricFamily("kapok_topic_delayed", "Delayed entries per topic", labels=["topic"])
    rows = snapshot.rows if snapshot.other is None else (*snapshot.rows, snapshot.other)
    for row in rows:
        live.add_metric([row.name], row.live)
        live_bytes.add_metric([row.name], row.live_bytes)
        delayed.add_metric([row.name], row.delayed)
        for group, n_ready, n_inflight, n_consumers in row.groups:
            labels = [row.name, group]
            ready.add_metric(labels, n_ready)
            inflight.add_metric(labels, n_inflight)
            consumers.add_metric(labels, n_consumers)
    folded = GaugeMetricFamily(
        "kapok_metrics_topics_folded",
        f"Topics past metrics.max_topics, summed under topic={OTHER_TOPICS!r}",
        value=snapshot.folded,
    )
    return [ready, inflight, consumers, live, live_bytes, delayed, folded]


# ---------------------------------------------------------------- when to render


class RenderCache:
    """Whether a scrape may be answered with the last body (pure: the caller gives the
    clock). A body is reused while younger than ``MAX_AGE_S``, unless it holds fewer than
    ``CACHED_FROM_ROWS`` topics and groups."""

    def __init__(self) -> None:
        self.body: bytes | None = None
        self.taken_at = -math.inf  # loop time of the body's snapshot
        self.cost_s = 0.0  # CPU seconds the last render took (loop and thread)
        self.rows = 0  # topics and groups in the last body
        self.renders = 0

    def reusable(self, now: float) -> bytes | None:
        if self.body is None or self.rows < CACHED_FROM_ROWS or now - self.taken_at >= MAX_AGE_S:
            return None
        return self.body

    def started(self) -> None:
        self.renders += 1

    def finished(self, body: bytes, taken_at: float, cost_s: float, rows: int) -> None:
        self.body, self.taken_at, self.cost_s, self.rows = body, taken_at, cost_s, rows


class Pacer:
    """Turns for scrapes without the key, one every ``1 / rate`` seconds (pure: the caller
    gives the clock): ``take`` says how long to wait for the next free turn, or None when
    that is longer than ``max_wait_s``."""

    def __init__(self, rate: float, max_wait_s: float) -> None:
        self.interval = 1.0 / rate
        self.max_wait_s = max_wait_s
        self.next_turn = -math.inf

    def take(self, now: float) -> float | None:
        turn = max(now, self.next_turn)
        if turn - now > self.max_wait_s:
            return None
        self.next_turn = turn + self.interval
        return turn - now


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _render_text(families: list[Metric], topics: TopicSnapshot) -> tuple[bytes, float]:
    """The exposition text and the CPU seconds it took (in the worker thread)."""
    cpu0 = time.thread_time()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families, *topic_families(topics)]))
    return generate_latest(registry), time.thread_time() - cpu0


class MetricsRegistry(CollectorRegistry):
    """The node's registry (node-wide families, whoever registers them) and the driver of
    its scrapes: snapshot on the loop, render in a thread, one render at a time, reused."""

    def __init__(self, service: BrokerService, clients: Clients) -> None:
        super().__init__(auto_describe=False)
        self.service = service
        self.cache = RenderCache()
        self.pacer = Pacer(ANONYMOUS_SCRAPES_PER_S, ANONYMOUS_WAIT_S)  # scrapes without the key
        self.keyed_pacer = Pacer(KEYED_SCRAPES_PER_S, KEYED_WAIT_S)  # with it
        self._pending: asyncio.Task[bytes] | None = None
        self.register(_ServiceCollector(service, clients, self.cache))

    async def body(self) -> bytes:
        """The exposition text: the last one while reusable, else the render under way (or a new one)."""
        loop = asyncio.get_running_loop()
        body = self.cache.reusable(loop.time())
        if body is not None:
            return body
        if self._pending is None:
            self._pending = task = loop.create_task(self._render())
            task.add_done_callback(self._rendered)
        return await asyncio.shield(self._pending)  # a scraper that leaves cancels only its wait

    def _rendered(self, task: asyncio.Task[bytes]) -> None:
        if self._pending is task:
            self._pending = None
        if not task.cancelled():
            task.exception()  # retrieved: the waiters (if any are left) get it too

    async def _render(self) -> bytes:
        taken_at = asyncio.get_running_loop().time()
        cpu0 = time.thread_time()
        self.cache.started()
        families = list(self.collect())  # small and fixed; collectors read loop-owned state
        topics = list(self.service.broker.topics.values())
        snapshot = snapshot_topics(topics, self.service.config.metrics.max_topics)
        loop_cost = time.thread_time() - cpu0
        body, thread_cost = await asyncio.to_thread(_render_text, families, snapshot)
        rows = snapshot.folded + sum(1 + len(row.groups) for row in snapshot.rows)
        self.cache.finished(body, taken_at, loop_cost + thread_cost, rows)
        return body


# ---------------------------------------------------------------- node-wide families


class _ServiceCollector(Collector):
    def __init__(self, service: BrokerService, clients: Clients, cache: RenderCache) -> None:
        self.service = service
        self.clients = clients
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        service = self.service
        stats = service.broker.stats
        for name, doc in _COUNTERS.items():
            family = CounterMetricFamily(f"kapok_messages_{name}", doc)
            family.add_metric([], getattr(stats, name))
            yield family
        bad = CounterMetricFamily("kapok_bad_input", "Malformed or refused input, by kind", labels=["kind"])
        for kind, n in sorted(self.clients.bad_input.items()):
            bad.add_metric([kind], n)
        yield bad
        auth = CounterMetricFamily("kapok_auth_failures", "Wrong or missing secret keys")
        auth.add_metric([], self.clients.auth_failures)
        yield auth
        clients = GaugeMetricFamily("kapok_clients", "Connected clients")
        clients.add_metric([], len(self.clients))
        yield clients
        for name, value in service.store.stats().items():
            base = name.removesuffix("_total")
            doc = f"Storage: {base.replace('_', ' ')}"
            if base != name:
                counter = CounterMetricFamily(f"kapok_storage_{base}", doc)
                counter.add_metric([], value)
                yield counter
            else:
                yield GaugeMetricFamily(f"kapok_storage_{base}", doc, value=value)
        stored = GaugeMetricFamily("kapok_messages_stored", "Messages held in memory, retained ones included")
        stored.add_metric([], len(service.broker.messages))
        yield stored
        yield _hooks_missing()
        renders = CounterMetricFamily("kapok_metrics_renders", "Times /metrics text was made (not reused)")
        renders.add_metric([], self.cache.renders)
        yield renders
        yield GaugeMetricFamily(
            "kapok_metrics_render_cpu_seconds",
            "CPU seconds the last /metrics text took to make (loop and thread)",
            value=self.cache.cost_s,
        )


def _hooks_missing() -> Metric:
    """1 for each optimisation hook into aiohttp this node runs without (said once at start
    as a WARNING; see ``aiohttp_seam``): an alert can catch a node that got slower by an upgrade."""
    missing = aiohttp_seam.missing_hooks()
    gauge = GaugeMetricFamily(
        "kapok_aiohttp_hooks_missing", "Optimisation hooks into aiohttp not installed", labels=["hook"]
    )
    for hook in aiohttp_seam.HOOKS:
        if not hook.required:
            gauge.add_metric([hook.name], 1 if hook.name in missing else 0)
    return gauge


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    if not isinstance(registry, MetricsRegistry):  # a registry of someone else's making
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
    given = bearer_token(request)
    keyed = given is not None or request.app[SERVICE].config.metrics.require_key
    if keyed and not await check_key(request, given):
        raise AuthError("missing or wrong 'Authorization: Bearer <secret key>' header")
    wait = (registry.keyed_pacer if keyed else registry.pacer).take(asyncio.get_running_loop().time())
    if wait is None:
        hint = "" if keyed else ", or scrape with the key (Authorization: Bearer <mq.secret_key>)"
        raise RateLimitedError(
            f"too many scrapes {'with' if keyed else 'without'} the key; try again later{hint}"
        )
    if wait > 0:
        await asyncio.sleep(wait)
    return web.Response(body=await registry.body(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_registry(service: BrokerService, clients: Clients) -> MetricsRegistry:
    return MetricsRegistry(service, clients)
