"""What a node knows of its partner besides the link: the gossip row, its ``/health``, and
how fresh that knowledge is.

A node acts on its partner's epoch and liveness (``protocol.assess``). Three things make
that knowledge trustworthy, and they live here:

* **Where the partner is.** A configured slave's master is what the operator wrote in
  ``replication.master``; otherwise the URL the partner advertises in gossip, or the one
  it gave when it paired. Nothing a peer says overrides the operator.
* **Fresh facts after a fence.** A fenced node takes writes again only once it has learned
  that its partner leads at no higher epoch, from the partner's own ``/health`` (probed
  while the node is not isolated: what it said during the cut may be overtaken) or from a
  gossip row newer than the one it had when it fenced. A majority coming back is not
  enough.
* **Doubt after a freeze.** A node whose tick ran ``pause_s`` late was frozen (SIGSTOP,
  a stalled VM, a starved loop; the tick takes no lock, so a long transition is not a
  freeze): its view is old and its partner may have taken over. It serves nothing until
  it has heard its partner again (the link or its ``/health``), or for at most a failover
  timeout, by which time gossip has refreshed its view.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import aiohttp
import orjson

from kapok.clock import loop_time
from kapok.cluster.messages import NodeState, State
from kapok.cluster.node import GossipNode
from kapok.config import ReplicationConfig
from kapok.replication.state import PairState
from kapok.tasks import cancel_and_wait

__all__ = ["Partner", "epoch_active", "probe_health"]

log = logging.getLogger("kapok.replication")

PROBE_TIMEOUT_S = 2.0


class Partner:
    def __init__(self, cfg: ReplicationConfig, gossip: GossipNode | None, configured_role: str) -> None:
        self.cfg = cfg
        self.gossip = gossip
        self.configured_role = configured_role
        self.health: tuple[int, bool] | None = None  # (epoch, active) from its /health
        self.pause_s = cfg.failover_timeout_s / 2  # a tick this late: we were frozen
        self._fence_incarnation = -1  # its gossip incarnation when we fenced
        self._last_tick = -math.inf
        self._doubt_since = self._doubt_until = -math.inf
        self._probe: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ what gossip says

    def row(self, state: PairState) -> NodeState | None:
        if self.gossip is None or state.partner is None:
            return None
        return next((m for m in self.gossip.members() if m.name == state.partner), None)

    def url(self, state: PairState) -> str:
        """Where the partner is (see the module's docstring)."""
        if self.configured_role == "slave" and self.cfg.master:
            return self.cfg.master
        row = self.row(state)
        if row is not None and row.meta.http_url:
            return str(row.meta.http_url)
        return state.partner_url or ""

    def epoch(self, state: PairState) -> int:
        """The highest epoch the partner is known to lead or have led at."""
        row = self.row(state)
        gossiped = row.meta.epoch if row is not None else 0
        return max(gossiped, self.health[0] if self.health is not None else 0)

    def leading(self, state: PairState) -> tuple[int, bool]:
        """The partner's (epoch, active) as gossip says, or its own /health when that shows
        it active at a higher epoch."""
        row = self.row(state)
        epoch = row.meta.epoch if row is not None else 0
        active = row is not None and row.meta.active and row.state in (State.ALIVE, State.SUSPECT)
        health = self.health
        if health is not None and health[1] and health[0] > epoch:
            return health
        return epoch, active

    # ------------------------------------------------------------ fencing

    def fenced(self, state: PairState) -> None:
        """We fence now: forget what we knew of the partner's epoch."""
        row = self.row(state)
        self._fence_incarnation = row.incarnation if row is not None else -1
        self.health = None

    def confirmed(self, state: PairState) -> bool:
        """Since the fence, we learned that the partner leads at no higher epoch than ours."""
        mine = state.epoch
        health = self.health
        if health is not None and (health[0] <= mine or not health[1]):
            return True
        row = self.row(state)
        if row is None:
            return self.gossip is not None and not state.paired
        fresh = row.incarnation > self._fence_incarnation and row.state is State.ALIVE
        return fresh and (row.meta.epoch <= mine or not row.meta.active)

    # ------------------------------------------------------------ its /health

    def probe(self, state: PairState) -> None:
        """Ask the partner's ``/health`` (one probe at a time); the answer lands in ``health``."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._ask(state))

    async def _ask(self, state: PairState) -> None:
        health = await probe_health(self.url(state))
        if health is not None and health.get("node") == state.partner:
            self.health = epoch_active(health)

    async def aclose(self) -> None:
        if self._probe is not None:
            await cancel_and_wait(self._probe)
            self._probe = None

    # ------------------------------------------------------------ freezes

    def started(self) -> None:
        self._last_tick = loop_time()

    def tick(self, state: PairState, last_heard: float | None) -> bool:
        """The watchdog's tick; returns whether the doubt after a freeze just ended (or a new
        one began), so the node announces its changed ``active``. ``last_heard``: when the
        link last brought a frame, None without one."""
        now = loop_time()
        changed = False
        if now - self._last_tick > self.pause_s and state.paired:
            log.warning(
                "this node was frozen for %.1f s: checking its partner before it serves",
                now - self._last_tick,
            )
            self._doubt_since, self._doubt_until = now, now + self.cfg.failover_timeout_s
            self.health = None
            self.probe(state)
            changed = True
        self._last_tick = now
        heard = self.health is not None or (last_heard is not None and last_heard > self._doubt_since)
        if now < self._doubt_until and heard:
            self._doubt_until = -math.inf
            changed = True
        return changed

    def in_doubt(self) -> bool:
        """Frozen, or not yet past the doubt that followed a freeze."""
        now = loop_time()
        return now - self._last_tick > self.pause_s or now < self._doubt_until


def epoch_active(health: dict[str, Any]) -> tuple[int, bool]:
    epoch = health.get("epoch", 0)
    return (epoch if type(epoch) is int else 0, health.get("active") is True)


async def probe_health(url: str) -> dict[str, Any] | None:
    """A node's ``/health``, or None when it does not answer."""
    if not url:
        return None
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + "/health") as resp,
        ):
            if resp.status != 200:
                return None
            body = orjson.loads(await resp.read())
            return body if isinstance(body, dict) else None
    except (OSError, aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
