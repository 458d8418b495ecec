"""What the console shows, as plain JSON-ready dicts: one function per page.

The pages render these server-side and ``/console/api/...`` serves the very same dicts
for the live refresh, so a figure has one source. Everything is read from the service
and the broker's public state (the same as ``/metrics``, ``/v1/topics`` and
``/cluster/nodes`` read), and counts come from the broker's running counters, never from
a scan of the messages: a refresh every few seconds must cost next to nothing on a node
holding a million of them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from kapok import __version__
from kapok.config import public_dict
from kapok.console.pairs import LIVE, pairs
from kapok.console.rates import RATES
from kapok.core.model import Status
from kapok.core.topics import Group, Topic
from kapok.server.guard.clients import ClientInfo
from kapok.server.keys import CLIENTS, REPLICATION, SERVICE
from kapok.server.routes.cluster_view import member_rows
from kapok.server.routes.ops import pair_role
from kapok.server.routes.sync import pair_state

__all__ = ["clients", "cluster", "config_rows", "disk_usage", "overview", "topics"]

# Ready entries looked at per queue to find the oldest waiting message: a queue may start
# with entries settled in place (deleted, expired), which are skipped lazily.
_OLDEST_LOOKAHEAD = 64
BEHIND_S = 60.0  # a group whose oldest ready message waited this long is shown as behind


def overview(app: web.Application) -> dict[str, Any]:
    service = app[SERVICE]
    broker = service.broker
    sampler = app[RATES]
    now = service.now()
    ready = inflight = delayed = live = dead_letters = 0
    for topic in broker.topics.values():
        live += topic.live_count
        delayed += topic.delayed_count
        if topic.is_dlq:
            dead_letters += topic.live_count
        for group in topic.groups.values():
            ready += group.ready_count
            inflight += group.inflight_count()
    stats = broker.stats
    totals = {
        name: getattr(stats, name)
        for name in ("published", "delivered", "redelivered", "acked", "nacked", "timeouts",
                     "dead_lettered", "expired", "dropped", "deleted", "duplicates")
    }  # fmt: skip
    node = app[REPLICATION]
    return {
        "node": {
            "name": service.node_name,
            "version": __version__,
            "role": pair_role(node),  # as now, after any failover (not as configured)
            "active": node.active,
            "replication": node.replication,  # what a write waits for: sync, async, alone, ...
            "link": node.link_state(),
            "http_url": service.http_url,
            "started_at": service.started_at,
            "uptime_s": round(now - service.started_at, 1),
        },
        "counts": {
            "topics": len(broker.topics),
            "held": len(broker.messages),
            "live": live,
            "finished": len(broker.messages) - live,
            "ready": ready,
            "inflight": inflight,
            "delayed": delayed,
            "dead_letters": dead_letters,
            "consumers": sum(1 for c in broker.consumers.values() if not c.is_pull),
            "clients": len(app[CLIENTS]),
        },
        "totals": totals,
        "rates": {k: round(v, 2) for k, v in sampler.rates().items()},
        "chart": sampler.history_chart(),
        "storage": dict(service.store.stats()),
    }


def config_rows(app: web.Application) -> list[tuple[str, str]]:
    """The effective configuration as ``(section.key, value)`` rows, secrets masked."""
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value and prefix != "mq.topics.":
            for key, sub in value.items():
                walk(f"{prefix}{key}.", sub)
        else:
            rows.append((prefix.rstrip("."), "" if value is None else str(value)))

    walk("", public_dict(app[SERVICE].config))
    return rows


def disk_usage(storage_dir: str) -> dict[str, float]:
    """Bytes and files of the data directory's parts and the free space of its disk (blocking:
    run it in a thread). Missing folders count as empty."""
    out: dict[str, float] = {}
    root = Path(storage_dir)
    for part in ("wal", "snapshots", "archive"):
        size = files = 0
        try:
            with os.scandir(root / part) as it:
                for entry in it:
                    if entry.is_file():
                        files += 1
                        size += entry.stat().st_size
        except OSError:
            pass
        out[f"{part}_bytes_on_disk"] = size
        out[f"{part}_files"] = files
    try:
        usage = shutil.disk_usage(root)
        out["disk_free_bytes"], out["disk_total_bytes"] = usage.free, usage.total
    except OSError:
        out["disk_free_bytes"] = out["disk_total_bytes"] = 0
    return out


def _oldest_ready(group: Group) -> float | None:
    """Creation time of the oldest message waiting in ``group`` (None: nothing waits)."""
    oldest: float | None = None
    for queue in group.queues():
        for i, entry in enumerate(queue):
            if i >= _OLDEST_LOOKAHEAD:
                break
            if entry.status is Status.READY:
                created = entry.msg.create_time
                oldest = created if oldest is None else min(oldest, created)
                break
    return oldest


def _topic(app: web.Application, topic: Topic, now: float) -> dict[str, Any]:
    broker = app[SERVICE].broker
    sampler = app[RATES]
    dlq = broker.topics.get(topic.name + ".dlq")
    groups = []
    for group in topic.groups.values():
        deliver = ack = 0.0
        for consumer in group.consumers:
            d, a = sampler.consumer_rates(consumer.id)
            deliver, ack = deliver + d, ack + a
        ready, inflight = group.ready_count, group.inflight_count()
        oldest = _oldest_ready(group)
        age = None if oldest is None else round(max(now - oldest, 0.0), 1)
        groups.append({
            "name": group.name,
            "durable": group.durable,
            "ready": ready,
            "inflight": inflight,
            "lag": ready + inflight,
            "oldest_age_s": age,
            "state": "behind" if age is not None and age >= BEHIND_S else "ok",
            "consumers": group.consumer_count(),
            "deliver_rate": round(deliver, 2),
            "ack_rate": round(ack, 2),
        })  # fmt: skip
    cfg = topic.cfg
    return {
        "name": topic.name,
        "mode": "p2p" if cfg.push_type == 1 else "pubsub",
        "is_dlq": topic.is_dlq,
        "live": topic.live_count,
        "live_bytes": topic.live_bytes,
        "delayed": topic.delayed_count,
        "dead_letters": dlq.live_count if dlq is not None else 0,
        "dlq": dlq.name if dlq is not None else None,
        "limits": {"max_length": cfg.max_length or "unlimited", "max_bytes": cfg.max_bytes or "unlimited"},
        "browse_url": "/console/messages?" + urlencode({"topic": topic.name}),
        "dlq_url": "/console/messages?" + urlencode({"topic": dlq.name}) if dlq is not None else None,
        "publish_rate": round(sampler.topic_rate(topic.name), 2),
        "groups": groups,
    }


def topics(app: web.Application) -> dict[str, Any]:
    broker = app[SERVICE].broker
    now = app[SERVICE].now()
    rows = [_topic(app, t, now) for t in sorted(broker.topics.values(), key=lambda t: t.name)]
    return {"topics": rows}


def _kind(info: ClientInfo) -> str:
    if info.published and info.subscriptions:
        return "both"
    return "producer" if info.published else "consumer" if info.subscriptions else "idle"


def clients(app: web.Application) -> dict[str, Any]:
    """Connections by what they do (the topics they publish to, their subscriptions), and
    every subscription with its credit, counts and rates (a group's pull leases included)."""
    service = app[SERVICE]
    sampler = app[RATES]
    consumers = service.broker.consumers
    connections, owner = [], {}
    for info in sorted(app[CLIENTS].open.values(), key=lambda c: c.since):
        subscribed = sorted({consumers[i].group.topic.name for i in info.subscriptions if i in consumers})
        owner.update(dict.fromkeys(info.subscriptions, info.client_id))
        connections.append({
            "kind": _kind(info),
            "id": info.client_id,
            "publishes_to": ", ".join(sorted(info.published)),
            "subscribed_to": ", ".join(subscribed),
            "address": info.ip,
            "since": info.since,
            "protocol": info.protocol,
        })  # fmt: skip
    subscriptions = []
    for c in consumers.values():
        deliver, ack = sampler.consumer_rates(c.id)
        subscriptions.append({
            "id": c.id,
            "name": "(pull leases)" if c.is_pull else c.name,
            "client": owner.get(c.id, ""),
            "topic": c.group.topic.name,
            "group": c.group.name,
            "pattern": c.pattern.source if c.pattern is not None else "",
            "ack": "auto" if c.auto_ack else "manual",
            "prefetch": c.prefetch,
            "inflight": len(c.held),
            "credit": max(c.credit, 0),
            "delivered": c.delivered,
            "acked": c.acked,
            "deliver_rate": round(deliver, 2),
            "ack_rate": round(ack, 2),
            "since": c.since,
        })  # fmt: skip
    return {"connections": connections, "subscriptions": subscriptions}


def _lag(row: dict[str, Any]) -> dict[str, Any] | None:
    lag = row.get("lag")
    return lag if isinstance(lag, dict) else None


def cluster(app: web.Application) -> dict[str, Any]:
    """Every gossip member, and the members as pair cards (``kapok.console.pairs``): this
    node's own pair as its replication sees it, the others as gossip tells them."""
    rows = member_rows(app)
    for row in rows:
        url = row.get("http_url") or ""
        # Gossip metadata comes from the network: link only to what is an http(s) URL.
        row["console_url"] = f"{url}/console/cluster" if url.startswith(("http://", "https://")) else None
        row["lag"] = _lag(row)
        row["active"] = row.get("active") is True and row.get("state") in LIVE  # never a dead node
    states: dict[str, int] = dict.fromkeys(("alive", "suspect", "dead", "left"), 0)
    for row in rows:
        states[row["state"]] = states.get(row["state"], 0) + 1
    local = pair_state(app[REPLICATION])
    return {"members": rows, "pairs": pairs(rows, local), "states": states}
