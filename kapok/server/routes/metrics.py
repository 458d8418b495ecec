"""Prometheus metrics, read from the service at scrape time.

Nothing is counted twice on the hot path: the broker keeps plain integer
counters and this collector turns them into metric families when
``/metrics`` is scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.server import aiohttp_seam
from kapok.server.guard.clients import Clients
from kapok.server.keys import REGISTRY
from kapok.service import BrokerService

__all__ = ["make_registry", "routes"]

routes = web.RouteTableDef()

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


class _ServiceCollector(Collector):
    def __init__(self, service: BrokerService, clients: Clients) -> None:
        self.service = service
        self.clients = clients

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
        ready = GaugeMetricFamily("kapok_group_ready", "Ready messages per group", labels=["topic", "group"])
        inflight = GaugeMetricFamily(
            "kapok_group_inflight", "Unacked deliveries per group", labels=["topic", "group"]
        )
        consumers = GaugeMetricFamily(
            "kapok_group_consumers", "Consumers per group", labels=["topic", "group"]
        )
        live = GaugeMetricFamily("kapok_topic_live", "Unfinished messages per topic", labels=["topic"])
        live_bytes = GaugeMetricFamily(
            "kapok_topic_live_bytes", "Payload bytes of unfinished messages", labels=["topic"]
        )
        delayed = GaugeMetricFamily("kapok_topic_delayed", "Delayed entries per topic", labels=["topic"])
        for topic in service.broker.topics.values():
            live.add_metric([topic.name], topic.live_count)
            live_bytes.add_metric([topic.name], topic.live_bytes)
            delayed.add_metric([topic.name], topic.delayed_count)
            for group in topic.groups.values():
                labels = [topic.name, group.name]
                ready.add_metric(labels, group.ready_count)
                inflight.add_metric(labels, group.inflight_count())
                consumers.add_metric(labels, group.consumer_count())
        yield from (ready, inflight, consumers, live, live_bytes, delayed)
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
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_registry(service: BrokerService, clients: Clients) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServiceCollector(service, clients))
    return registry
