"""The R-scenarios of the SWIM membership on real ``kapok serve`` processes.

    python -m kapok.bench.gossip_real --nodes 8 --runs 20 [--profile fast]
    python -m kapok.bench.gossip_real --scenario r4|r5 --seconds 120

On one loopback cluster of ``--nodes`` processes, ``--runs`` times each:

* R1 ``kill -9`` a random node (not the seed): seconds until every survivor logged it dead
  (p50 / p99 / max), and any other member any survivor declared dead (false deaths); the
  node is then restarted on its old ports and must be alive everywhere again.
* R2 a fresh node joins through one random member: seconds until all views hold it alive.
* R3 a graceful stop (SIGTERM): seconds until every other node logged it ``left``.

``--scenario r4``: every node drops 10% of its datagrams each way; ``r5``: one node blocks
its event loop 2 s every 10 s (both through ``kapok.faulty``): false deaths and
suspicions over ``--seconds``, and the stalled node's health score.

Times come from the nodes' own log lines (millisecond timestamps), not from polling, so
they do not depend on how fast this script can ask. A benchmark, not a test: nothing is
asserted; the table prints the figures beside the targets.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kapok.launch import NodeProcess, cluster_sets, nodes_view, start_cluster, start_node, stop_all, wait_for

__all__ = ["main"]

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ kapok\.cluster: "
_LINE = re.compile(_STAMP + r"member (\S+) \(\S+\) is (\w+)")
_JOINING = re.compile(_STAMP + r"gossip on ", re.M)
_DEADLINE_S = 30.0


@dataclass
class Figures:
    r1: list[float] = field(default_factory=list)
    r2: list[float] = field(default_factory=list)
    r3: list[float] = field(default_factory=list)
    false_deaths: int = 0


def _stamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _events(node: NodeProcess, since: float) -> list[tuple[float, str, str]]:
    """(wall time, member, state) of the membership lines a node logged after ``since``."""
    out = []
    for line in node.output.splitlines():
        match = _LINE.match(line)
        if match:
            at = _stamp(match.group(1))
            if at >= since:
                out.append((at, match.group(2), match.group(3)))
    return out


def _name(node: NodeProcess) -> str:
    return node.url.removeprefix("http://")


def _all_see(nodes: list[NodeProcess], name: str, state: str) -> bool:
    return all(nodes_view(n).get(name, {}).get("state") == state for n in nodes)


def _last_seen(nodes: list[NodeProcess], name: str, state: str, since: float) -> float:
    """When the last of ``nodes`` logged ``name`` in ``state``, seconds after ``since``."""
    times = [max(t for t, who, s in _events(n, since) if who == name and s == state) for n in nodes]
    return max(times) - since


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    median = statistics.median(ordered)
    return f"p50 {median:.2f} s, p99 {p99:.2f} s, max {ordered[-1]:.2f} s (n={len(values)})"


class _Runner:
    def __init__(self, nodes: list[NodeProcess], profile: str, sets: list[str], base: Path) -> None:
        self.nodes, self.profile, self.sets, self.base = nodes, profile, sets, base
        self.fig = Figures()

    def crash(self, victim: NodeProcess) -> None:
        """R1: kill -9, time until every survivor logged it dead; then restart it on its ports."""
        nodes, name = self.nodes, _name(victim)
        others = [n for n in nodes if n is not victim]
        port, gossip, workdir = victim.url.rsplit(":", 1)[1], victim.gossip_addr, victim.workdir
        killed_at = time.time()
        victim.kill()
        wait_for(lambda: _all_see(others, name, "dead"), _DEADLINE_S, 0.05)
        self.fig.r1.append(_last_seen(others, name, "dead", killed_at))
        for node in others:
            events = _events(node, killed_at)
            self.fig.false_deaths += sum(state == "dead" and who != name for _, who, state in events)
        sets = [*cluster_sets(self.profile, [nodes[0].gossip_addr]), *self.sets]
        back = start_node(workdir, *sets, f"server.port={port}", f"cluster.bind={gossip}")
        nodes[nodes.index(victim)] = back
        wait_for(lambda: _all_see(nodes, name, "alive"), _DEADLINE_S, 0.05)

    def join_and_leave(self, seed: NodeProcess, workdir: Path) -> None:
        """R2: a new node joins through ``seed``, timed from its join; R3: it stops gracefully."""
        nodes = self.nodes
        joiner = start_node(workdir, *cluster_sets(self.profile, [seed.gossip_addr]), *self.sets)
        name = _name(joiner)
        try:
            wait_for(lambda: _all_see(nodes, name, "alive"), _DEADLINE_S, 0.05)
            joined = _JOINING.search(joiner.output)
            if joined is not None:
                self.fig.r2.append(_last_seen(nodes, name, "alive", _stamp(joined.group(1))))
        finally:
            stopped_at = time.time()
            joiner.stop()
        wait_for(lambda: _all_see(nodes, name, "left"), _DEADLINE_S, 0.05)
        self.fig.r3.append(_last_seen(nodes, name, "left", stopped_at))


def run(nodes_count: int, runs: int, profile: str, base: Path, rng: random.Random) -> Figures:
    sets = ["cluster.secret=bench"]
    nodes = start_cluster(base, nodes_count, *sets, profile=profile)
    runner = _Runner(nodes, profile, sets, base)
    fig = runner.fig
    try:
        wait_for(lambda: all(_all_see(nodes, _name(m), "alive") for m in nodes), _DEADLINE_S, 0.1)
        for i in range(runs):
            runner.crash(nodes[rng.randrange(1, len(nodes))])
            runner.join_and_leave(nodes[rng.randrange(len(nodes))], base / f"joiner{i}")
            figures = f"R1 {fig.r1[-1]:.2f} s, R2 {fig.r2[-1]:.2f} s, R3 {fig.r3[-1]:.2f} s"
            print(f"run {i + 1}/{runs}: {figures}", flush=True)
    finally:
        stop_all(nodes)
    return fig


def _health(node: NodeProcess) -> float | None:
    """The node's Lifeguard health score, or None while it does not answer (blocked)."""
    try:
        with urllib.request.urlopen(node.url + "/metrics", timeout=0.5) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = re.search(r"^kapok_gossip_health_score (\S+)$", text, re.M)
    return None if match is None else float(match.group(1))


def run_faults(
    nodes_count: int, profile: str, base: Path, *, loss: float, stalled: bool, duration_s: float
) -> dict[str, float]:
    """R4 (every node drops ``loss`` of its datagrams each way) or R5 (node 1 blocks its loop
    2 s every 10 s for ``duration_s``): false deaths, false suspicions, and for R5 the stalled
    node's health score."""

    def launcher(i: int) -> tuple[str, ...]:
        faults: tuple[str, ...] = ()
        if loss:
            faults += ("--loss", str(loss), "--seed", str(i))
        if stalled and i == 1:
            faults += ("--block-s", "2", "--every-s", "10", "--until-s", str(duration_s))
        return ("-m", "kapok.faulty", *faults, "--")

    nodes = start_cluster(base, nodes_count, "cluster.secret=bench", profile=profile, launcher=launcher)
    out: dict[str, float] = {}
    try:
        wait_for(lambda: all(_all_see(nodes, _name(m), "alive") for m in nodes), _DEADLINE_S, 0.1)
        began = time.time()
        peak = 0.0
        while time.time() - began < duration_s:
            score = _health(nodes[1]) if stalled else None
            peak = max(peak, score or 0.0)
            time.sleep(0.5)
        events = [e for n in nodes for e in _events(n, began)]
        stalled_name = _name(nodes[1]) if stalled else ""
        out["false_deaths"] = sum(state == "dead" and who != stalled_name for _, who, state in events)
        out["false_suspicions"] = sum(state == "suspect" for _, _, state in events)
        out["suspicions_per_node_minute"] = out["false_suspicions"] / nodes_count / (duration_s / 60)
        if stalled:
            out["stalled_node_health_peak"] = peak
            calm = time.time()
            wait_for(lambda: _health(nodes[1]) == 0.0, 60.0, 0.5)
            out["health_back_to_0_s"] = time.time() - calm
            for state in ("suspect", "dead"):
                out[f"stalled_node_{state}"] = sum(who == stalled_name and s == state for _, who, s in events)
    finally:
        stop_all(nodes)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kapok.bench.gossip_real", description="R1-R5 on real processes"
    )
    parser.add_argument("--scenario", default="r1-r3", choices=("r1-r3", "r4", "r5"))
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20, help="r1-r3: rounds")
    parser.add_argument("--seconds", type=float, default=120.0, help="r4 / r5: observed time")
    parser.add_argument("--profile", default="fast", choices=("fast", "lan"))
    parser.add_argument("--seed", type=int, default=1, help="random seed of the victim / seed choices")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kapok-realrun-") as tmp:
        if args.scenario != "r1-r3":
            loss = 0.1 if args.scenario == "r4" else 0.0
            figures = run_faults(
                args.nodes,
                args.profile,
                Path(tmp),
                loss=loss,
                stalled=args.scenario == "r5",
                duration_s=args.seconds,
            )
            what = f"{args.nodes} processes, profile {args.profile}, {args.seconds:.0f} s"
            print(f"\n{args.scenario.upper()}: {what}")
            for key, value in figures.items():
                print(f"| {key} | {value:.3g} |")
            return 0
        fig = run(args.nodes, args.runs, args.profile, Path(tmp), random.Random(args.seed))
    fast = args.profile == "fast"
    print(f"\n{args.nodes} processes, profile {args.profile}, {args.runs} runs")
    print("| scenario | measured | target |\n|---|---|---|")
    r1_target = "p50 ≤ 1.0 s, p99 ≤ 2.0 s" if fast else "p99 ≤ 8 s"
    print(f"| R1 kill -9: dead in every survivor's log | {_summary(fig.r1)} | {r1_target} |")
    print(f"| R1 false deaths | {fig.false_deaths} | 0 |")
    r2_target = f"p99 ≤ {1 if fast else 3} s"
    print(f"| R2 join through one member: alive in every view | {_summary(fig.r2)} | {r2_target} |")
    print(f"| R3 graceful leave: left in every view | {_summary(fig.r3)} | ≤ 1 s (fast) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
