"""The node's replication routes and metrics: ``/sync/v1`` (the slave's link), the pair's
state and the operator's unpair, and the ``kapok_replication_*`` metrics.

The routes are thin: the pair's rules live in ``kapok.replication``. ``/sync/v1``,
``/replication/unpair`` and ``/replication/promote`` need the secret key, checked by the
auth middleware before the WebSocket upgrade, so a wrong key never sees a byte of the log;
``/replication/state`` checks it itself (it names the partner and gives out its URL).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import WSCloseCode, web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok.errors import AuthError, KapokError, NotActiveError
from kapok.replication.node import ReplicationNode
from kapok.replication.protocol import Role
from kapok.server.guard.auth import bearer_token, check_key
from kapok.server.keys import REGISTRY, REPLICATION
from kapok.server.routes.responses import json_response
from kapok.server.ws.base import accept

__all__ = ["pair_state", "replication_ctx", "routes"]

log = logging.getLogger("kapok.replication")

routes = web.RouteTableDef()

MAX_SLAVE_FRAME = 1024 * 1024  # a slave sends only small control frames


@routes.get("/sync/v1")
async def sync_link(request: web.Request) -> web.StreamResponse:
    node = request.app[REPLICATION]
    leader = node.leader
    if leader is None:
        raise NotActiveError(f"{node.name} is not the active master of its pair; no slave may follow it")
    ws = await accept(request, max_size=MAX_SLAVE_FRAME, heartbeat_s=None)  # the link pings itself
    try:
        await leader.serve(node.link_factory(ws))
    except KapokError as exc:
        log.warning("sync link from %s: %s", request.remote, exc.message)
    except (ConnectionError, TimeoutError) as exc:
        log.info("sync link from %s ended: %s", request.remote, exc or type(exc).__name__)
    finally:
        if not ws.closed:
            await ws.close(code=WSCloseCode.GOING_AWAY)
    return ws.response


def pair_state(node: ReplicationNode) -> dict[str, Any]:
    """The pair as this node sees it (``GET /replication/state``, the console)."""
    state, lag = node.state, node.lag()
    leader = node.leader
    link_up = node.follower.link_up if node.follower is not None else leader is not None and leader.link_up
    applier = node.current_applier()  # a slave's: what it journaled and has not applied yet
    unapplied = (applier.queue.records, applier.queue.bytes) if applier is not None else (0, 0)
    return {
        "node": node.name,
        "role": node.role.value,
        "configured_role": node.configured_role,
        "active": node.active,
        "epoch": state.epoch,
        "history": [list(h) for h in state.history],
        "partner": state.partner,
        "partner_url": state.partner_url,
        "mode": node.cfg.mode,
        "link_up": link_up,
        "link": node.link_state(),
        "replication": node.replication,
        "alone_since": node.alone_since,
        "in_sync": node.follower.in_sync if node.follower is not None else None,
        "lag": None if lag is None else {"records": lag[0], "bytes": lag[1], "seconds": lag[2]},
        "backlog_bytes": leader.backlog.bytes if leader is not None else 0,
        "unapplied": {"records": unapplied[0], "bytes": unapplied[1]},
    }


@routes.get("/replication/state")
async def replication_state(request: web.Request) -> web.Response:
    if not await check_key(request, bearer_token(request)):
        raise AuthError("missing or wrong 'Authorization: Bearer <secret key>' header")
    return json_response(pair_state(request.app[REPLICATION]))


@routes.post("/replication/unpair")
async def unpair(request: web.Request) -> web.Response:
    node = request.app[REPLICATION]
    await node.unpair()
    return json_response(pair_state(node))


@routes.post("/replication/promote")
async def promote(request: web.Request) -> web.Response:
    """An operator makes a slave lead (``?force=true``: even one that was not in sync)."""
    node = request.app[REPLICATION]
    await node.promote(force=request.query.get("force") in ("1", "true", "yes"))
    return json_response(pair_state(node))


class _ReplicationCollector(Collector):
    def __init__(self, node: ReplicationNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        state = GaugeMetricFamily(
            "kapok_replication_state", "This node's role in its pair (1 = current)", labels=["role"]
        )
        for role in Role:
            state.add_metric([role.value], 1 if node.role is role else 0)
        yield state
        yield GaugeMetricFamily("kapok_replication_epoch", "The pair's fencing epoch", value=node.state.epoch)
        yield GaugeMetricFamily(
            "kapok_replication_alone",
            "1 while this node confirms writes without its partner (sync mode, the majority seen)",
            value=1 if node.alone_since is not None else 0,
        )
        lag = node.lag()
        for i, (name, doc) in enumerate(
            (("records", "Records the slave is behind"), ("bytes", "Log bytes the slave is behind"),
             ("seconds", "Age of the oldest record the slave has not acked"))
        ):  # fmt: skip
            value = -1.0 if lag is None else float(lag[i])
            yield GaugeMetricFamily(
                f"kapok_replication_lag_{name}", f"{doc} (-1: not replicating)", value=value
            )
        leader = node.leader
        backlog = leader.backlog.bytes if leader is not None else 0
        yield GaugeMetricFamily(
            "kapok_replication_backlog_bytes", "The master's in-memory log", value=backlog
        )
        counters = {
            "takeovers": (node.takeovers, "Times this node took over from a silent master"),
            "hand_overs": (node.hand_overs, "Clean hand-overs this node gave or received"),
            "step_downs": (node.step_downs, "Times this node stopped leading for a higher epoch"),
            "diverged_records": (node.diverged_records, "Records set aside in diverged/ after a failover"),
            "full_transfers": (leader.full_transfers if leader else 0, "Full state transfers sent"),
            "resumes": (leader.resumes if leader else 0, "Slaves that resumed from the backlog"),
            "sync_timeouts": (leader.sync_timeouts if leader else 0, "Sync confirmations that timed out"),
            "bad_frames": (
                leader.bad_frames if leader else 0,
                "Slave sessions ended for breaking the protocol",
            ),
            "refusals": (
                node.follower.refusals if node.follower else 0,
                "Times the master refused this slave (wrong key, another slave, unknown token)",
            ),
        }
        for name, (value, doc) in counters.items():
            counter = CounterMetricFamily(f"kapok_replication_{name}", doc)
            counter.add_metric([], value)
            yield counter


async def replication_ctx(app: web.Application) -> AsyncIterator[None]:
    """Decide the first role once the store is recovered and gossip runs; stop the links last."""
    node = app[REPLICATION]
    await node.start()
    app[REGISTRY].register(_ReplicationCollector(node))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await node.aclose()
