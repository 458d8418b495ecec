"""What the S1–S8 simulator scenarios (``kapok.bench.gossip_scenarios``) are built from.

``Params`` (the cluster size, the seeds, the SWIM settings, the network), the ``Result`` of a
scenario as ``Check`` rows, a nearest-rank percentile, the ``Recorder`` that watches every
membership change of a simulation, a cluster formed at once, and the crash-detection run
that S1, S5 and S8 share.
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from kapok.cluster.config import SwimConfig
from kapok.cluster.messages import MemberChanged, State
from kapok.testing.simnet import Network, SimNode, Simulator

__all__ = [
    "ALIVE",
    "DEAD",
    "SUSPECT",
    "Check",
    "Params",
    "Recorder",
    "Result",
    "detect",
    "formed",
    "pct",
]

ALIVE, SUSPECT, DEAD = State.ALIVE, State.SUSPECT, State.DEAD


@dataclass(frozen=True, slots=True)
class Params:
    n: int = 1000
    seeds: int = 5
    first_seed: int = 1
    config: SwimConfig = field(default_factory=SwimConfig)
    duration_s: float = 600.0  # S4's quiescent run and S8's speed run
    quick: bool = False  # fewer arms (one loss level, one slow fraction) for test grids
    tcp_rto: bool = False  # streams pay Linux's TCP retransmission timeouts for lost segments

    def net(self, loss: float = 0.0) -> Network:
        return Network(loss=loss).with_linux_rto() if self.tcp_rto else Network(loss=loss)


@dataclass(frozen=True, slots=True)
class Check:
    metric: str
    measured: str
    target: str
    ok: bool | None  # None: reported, no target


@dataclass(slots=True)
class Result:
    scenario: str
    title: str
    checks: list[Check] = field(default_factory=list)
    wall_s: float = 0.0

    def add(self, metric: str, measured: str, target: str = "", ok: bool | None = None) -> None:
        self.checks.append(Check(metric, measured, target, ok))

    @property
    def ok(self) -> bool:
        return all(c.ok is not False for c in self.checks)


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class Recorder:
    """Watches every ``MemberChanged`` of a simulation and keeps the figures the targets need."""

    def __init__(self, sim: Simulator, watch: Sequence[str] = ()) -> None:
        self.sim = sim
        self.watch = set(watch)
        self.seen_dead: dict[str, dict[int, float]] = {w: {} for w in watch}
        self.seen_alive: dict[str, dict[int, float]] = {w: {} for w in watch}
        self.false_deaths: list[tuple[float, str, str]] = []
        self.false_suspicions = 0  # observer rows turned suspect while the member was up
        self.accusations: set[tuple[str, int]] = set()  # distinct (member, incarnation) suspected
        self.alive_view: dict[int, int] = {}
        self.full_at_size = 0
        self.full = 0
        sim.observers.append(self)

    def __call__(self, node: SimNode, e: MemberChanged, now: float) -> None:
        if e.name == node.name:
            return
        if e.name in self.watch:
            if e.state is DEAD:
                self.seen_dead[e.name].setdefault(node.index, now)
            elif e.state is ALIVE:
                self.seen_alive[e.name].setdefault(node.index, now)
        if (e.state is DEAD or e.state is SUSPECT) and e.state is not e.previous:
            target = self.sim.by_name.get(e.name)
            if target is not None and target.up:
                if e.state is DEAD:
                    self.false_deaths.append((now, node.name, e.name))
                else:
                    self.false_suspicions += 1
                    self.accusations.add((e.name, e.incarnation))
        delta = (e.state is ALIVE) - (e.previous is ALIVE)
        if delta and self.full_at_size:
            before = self.alive_view.get(node.index, 0)
            self.alive_view[node.index] = before + delta
            goal = self.full_at_size - 1
            self.full += (before + delta == goal) - (before == goal)

    def track_full_view(self, size: int) -> None:
        """Count nodes that see ``size − 1`` others alive (call before the changes happen)."""
        self.full_at_size = size
        self.alive_view = {
            n.index: sum(1 for s in n.swim.members() if s.state is ALIVE) - 1 for n in self.sim.nodes
        }
        self.full = sum(1 for v in self.alive_view.values() if v == size - 1)


def formed(
    p: Params, seed: int, net: Network, n: int | None = None, cfg: SwimConfig | None = None
) -> Simulator:
    """A simulator whose ``n`` nodes (default ``p.n``) all know each other alive."""
    # The previous run's simulator was frozen: release it before building the next one.
    gc.unfreeze()
    gc.collect()
    sim = Simulator(cfg or p.config, seed, net)
    nodes = [sim.add_node() for _ in range(p.n if n is None else n)]
    sim.bootstrap(nodes)
    gc.collect()
    gc.freeze()  # a million long-lived rows: keep them out of every later collection
    return sim


def detect(
    p: Params, seed: int, net: Network, cfg: SwimConfig, slow: float = 0.0, horizon: float = 120.0
) -> tuple[list[float], int, int, int]:
    """Crash one node of a formed cluster: per-observer detection times, observers that never
    detected it, false deaths, and distinct false accusations."""
    sim = formed(p, seed, net, cfg=cfg)
    rng = random.Random(seed * 7919)
    normal = list(sim.nodes)
    if slow:
        for node in rng.sample(sim.nodes, max(1, round(slow * len(sim.nodes)))):
            node.slow = True
        normal = [nd for nd in sim.nodes if not nd.slow]
    victim = rng.choice(normal)
    rec = Recorder(sim, [victim.name])
    t_crash = (30.0 if slow else 5.0) + rng.random()
    sim.at(t_crash, lambda: sim.crash(victim))
    seen = rec.seen_dead[victim.name]
    live = len(sim.nodes) - 1
    sim.run_until(t_crash + horizon, stop=lambda: len(seen) >= live and sim.now > t_crash)
    times = [t - t_crash for t in seen.values()]
    return times, live - len(seen), len(rec.false_deaths), len(rec.accusations)
