"""The S1–S8 simulator scenarios of the SWIM membership, with their targets.

Each scenario runs one or more seeded simulations (``simnet.Simulator``) and returns a
``Result`` (``kapok.bench.gossip_harness``): rows of *metric, measured, target, pass*.
Targets are set for N = 1,000 with the ``lan`` profile. Where a target depends on N
through the suspicion timeout (S1's detection times), it is written as the N = 1,000
figure minus that N's minimum suspicion timeout (12 s), plus the minimum at the N being
run, so a reduced grid at N = 200 is held to the same margins.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from kapok.bench.gossip_harness import ALIVE, DEAD, Params, Recorder, Result, detect, formed, pct
from kapok.cluster.suspicion import push_pull_scale, suspicion_min_s
from kapok.testing.simnet import SimNode, Simulator

__all__ = ["SCENARIOS", "s8_determinism"]


def s1(p: Params) -> Result:
    r = Result("S1", "one node crashes, 1% loss, 1–3 ms latency")
    net = p.net(0.01)
    times: list[float] = []
    undetected = false = 0
    for seed in range(p.first_seed, p.first_seed + p.seeds):
        t, u, f, _ = detect(p, seed, net, p.config)
        times += t
        undetected += u
        false += f
    shift = suspicion_min_s(p.config.suspicion_mult, p.n, p.config.probe_interval_s) - 12.0
    for q, target in ((50, 14.5), (99, 18.0), (100, 25.0)):
        v = pct(times, q)
        r.add(f"detection p{q} (s)", f"{v:.2f}", f"≤ {target + shift:.1f}", v <= target + shift)
    r.add("undetected observers", str(undetected), "0", undetected == 0)
    r.add("false deaths", str(false), "0", false == 0)
    return r


def _join_once(p: Params, seed: int, loss: float, horizon: float) -> list[float]:
    sim = formed(p, seed, p.net(loss), n=p.n - 1)
    newcomer = sim.add_node()
    seed_node = sim.nodes[random.Random(seed).randrange(p.n - 1)]
    rec = Recorder(sim, [newcomer.name])
    t_join = 5.0
    sim.at(t_join, lambda: sim.join(newcomer, [seed_node]))
    seen = rec.seen_alive[newcomer.name]
    sim.run_until(t_join + horizon, stop=lambda: len(seen) >= p.n - 1)
    return [t - t_join for t in seen.values()]


def s2(p: Params) -> Result:
    r = Result("S2", "one node joins through one seed")
    pp = push_pull_scale(p.config.push_pull_interval_s, p.n)
    arms = ((0.01, 4.0),) if p.quick else ((0.01, 4.0), (0.05, 8.0))
    for loss, p99_target in arms:
        times: list[float] = []
        late = 0
        for seed in range(p.first_seed, p.first_seed + p.seeds):
            seen = _join_once(p, seed, loss, pp)
            times += seen
            late += p.n - 1 - len(seen)
        tag = f"{loss:.0%} loss"
        if loss == 0.01:
            v = pct(times, 50)
            r.add(f"seen alive p50, {tag} (s)", f"{v:.2f}", "≤ 2.0", v <= 2.0)
        v = pct(times, 99)
        r.add(f"seen alive p99, {tag} (s)", f"{v:.2f}", f"≤ {p99_target:.1f}", v <= p99_target)
        r.add(
            f"observers not reached within {pp:.0f} s (one push-pull period), {tag}",
            str(late),
            "0",
            late == 0,
        )
    return r


def _formation_once(p: Params, seed: int) -> float:
    sim = formed(p, seed, p.net(0.01), n=0)
    nodes = [sim.add_node() for _ in range(p.n)]
    rec = Recorder(sim)
    rec.track_full_view(p.n)
    seed_node = nodes[0]
    sim.start(seed_node)

    def wave(members: list[SimNode]) -> None:
        for nd in members:
            sim.join(nd, [seed_node])

    for w, first in enumerate(range(1, p.n, 50)):
        sim.at(1.0 + w, partial(wave, nodes[first : first + 50]))
    sim.run_until(200.0, stop=lambda: rec.full >= p.n)
    return sim.now - 1.0 if rec.full >= p.n else math.inf


def s3(p: Params) -> Result:
    r = Result("S3", "cluster formation: waves of 50 a second joining one seed, 1% loss")
    within = [_formation_once(p, seed) for seed in range(p.first_seed, p.first_seed + p.seeds)]
    ok60 = sum(1 for t in within if t <= 60.0) / len(within)
    r.add("full view within 60 s (share of seeds)", f"{ok60:.0%}", "≥ 95%", ok60 >= 0.95)
    worst = max(within)
    r.add("slowest full view (s)", f"{worst:.1f}", "≤ 200", worst <= 200.0)
    r.add("median full view (s)", f"{pct(within, 50):.1f}")
    return r


def s4(p: Params) -> Result:
    r = Result("S4", f"no crash, {p.duration_s:.0f} simulated s, uniform loss")
    arms = (0.10,) if p.quick else (0.01, 0.05, 0.10)
    for loss in arms:
        deaths = suspicions = accusations = unrefuted = stream_pings = 0
        for seed in range(p.first_seed, p.first_seed + p.seeds):
            sim = formed(p, seed, p.net(loss))
            rec = Recorder(sim)
            sim.run_until(p.duration_s)
            deaths += len(rec.false_deaths)
            suspicions += rec.false_suspicions
            accusations += len(rec.accusations)
            stream_pings += sum(nd.swim.stats["stream_pings"] for nd in sim.nodes)
            unrefuted += sum(
                1 for nd in sim.nodes for st in nd.swim.members() if st.state is DEAD and st.name != nd.name
            )
        per_run = deaths / p.seeds
        target = 0.05 if loss >= 0.10 else 0.0
        r.add(f"false deaths per run, {loss:.0%} loss", f"{per_run:.2f}", f"≤ {target:g}", per_run <= target)
        node_minutes = p.seeds * p.n * p.duration_s / 60.0
        r.add(f"false accusations per node-minute, {loss:.0%}", f"{accusations / node_minutes:.4f}")
        r.add(f"observer rows turned suspect per node-minute, {loss:.0%}", f"{suspicions / node_minutes:.2f}")
        # Each fallback ping costs two TCP connections (the ping, and the ack back).
        r.add(f"fallback stream pings per node-minute, {loss:.0%}", f"{stream_pings / node_minutes:.1f}")
        r.add(f"live members held dead at the end, {loss:.0%}", str(unrefuted), "0", unrefuted == 0)
    return r


def s5(p: Params) -> Result:
    r = Result("S5", "slow nodes read packets 0.5–2.5 s late, 3% loss: Lifeguard vs plain SWIM")
    net = p.net(0.03)
    for frac in (0.05,) if p.quick else (0.01, 0.05):
        arm: dict[bool, tuple[list[float], int, int, int]] = {}
        for lifeguard in (True, False):
            cfg = replace(p.config, lifeguard=lifeguard)
            times: list[float] = []
            runs_with_death = deaths = accusations = 0
            for seed in range(p.first_seed, p.first_seed + p.seeds):
                t, _, f, a = detect(p, seed, net, cfg, slow=frac, horizon=90.0)
                times += t
                deaths += f
                runs_with_death += f > 0
                accusations += a
            arm[lifeguard] = (times, runs_with_death, deaths, accusations)
        (lg_t, lg_runs, lg_deaths, lg_acc), (sw_t, sw_runs, sw_deaths, sw_acc) = arm[True], arm[False]
        tag = f"{frac:.0%} slow"
        share = lg_runs / p.seeds
        r.add(f"Lifeguard runs with a false death, {tag}", f"{share:.0%}", "≤ 5%", share <= 0.05)
        r.add(f"plain SWIM runs with a false death, {tag}", f"{sw_runs / p.seeds:.0%}")
        ratio_ok = sw_deaths >= 10 * lg_deaths if sw_deaths else None
        r.add(f"false deaths Lifeguard / plain, {tag}", f"{lg_deaths} / {sw_deaths}", "≥ 10× fewer", ratio_ok)
        r.add(f"false accusations Lifeguard / plain, {tag}", f"{lg_acc} / {sw_acc}")
        d50, d99 = pct(lg_t, 50) - pct(sw_t, 50), pct(lg_t, 99) - pct(sw_t, 99)
        r.add(f"detection p50 Lifeguard − plain, {tag} (s)", f"{d50:+.2f}", "≤ +1.0", d50 <= 1.0)
        r.add(f"detection p99 Lifeguard − plain, {tag} (s)", f"{d99:+.2f}", "≤ +3.0", d99 <= 3.0)
    return r


def _partition_once(p: Params, seed: int, pp: float) -> tuple[float, float, float, int]:
    """Shares of cross-partition rows suspect-or-dead and dead at heal, time to full view
    after heal, rows stuck dead."""
    sim = formed(p, seed, p.net(0.01))
    rec = Recorder(sim)
    side = {nd.index: nd.index % 2 for nd in sim.nodes}
    t_split, t_heal = 5.0, 35.0
    sim.at(t_split, lambda: sim.set_partition(side))
    sim.run_until(t_heal)
    pairs = dead = detected = 0
    for nd in sim.nodes:
        for st in nd.swim.members():
            if side[sim.by_name[st.name].index] != side[nd.index]:
                pairs += 1
                dead += st.state is DEAD
                detected += st.state is not ALIVE
    sim.set_partition(None)
    rec.track_full_view(p.n)
    sim.run_until(t_heal + 2 * pp + 30.0, stop=lambda: rec.full >= p.n)
    healed = sim.now - t_heal if rec.full >= p.n else math.inf
    stuck = 0
    for nd in sim.nodes:
        for st in nd.swim.members():
            stuck += st.state is DEAD and st.incarnation >= sim.by_name[st.name].swim.incarnation
    return detected / max(pairs, 1), dead / max(pairs, 1), healed, stuck


def s6(p: Params) -> Result:
    r = Result("S6", "50/50 partition for 30 s, then heal, 1% loss")
    pp = push_pull_scale(p.config.push_pull_interval_s, p.n)
    runs = [_partition_once(p, seed, pp) for seed in range(p.first_seed, p.first_seed + p.seeds)]
    detected = min(x[0] for x in runs)
    r.add(
        "cross-partition rows suspect or dead at heal (worst seed)",
        f"{detected:.2%}",
        "100%",
        detected >= 1.0,
    )
    r.add("cross-partition rows dead at heal (worst seed)", f"{min(x[1] for x in runs):.2%}")
    heal = [x[2] for x in runs]
    r.add(
        "full view after heal, worst (s)",
        f"{max(heal):.1f}",
        f"≤ {2 * pp:.0f} (2 push-pull periods)",
        max(heal) <= 2 * pp,
    )
    r.add("full view after heal, median (s)", f"{pct(heal, 50):.1f}")
    stuck = sum(x[3] for x in runs)
    r.add("rows stuck dead at ≥ the live node's incarnation", str(stuck), "0", stuck == 0)
    return r


def _load(p: Params, n: int, seed: int) -> tuple[float, float, float, int]:
    sim = formed(p, seed, p.net(), n=n)
    # The window spans a whole push-pull period, so stream traffic is measured too.
    warm, window = 60.0, max(60.0, push_pull_scale(p.config.push_pull_interval_s, n))
    sim.run_until(warm)
    packets = sum(nd.packets_sent for nd in sim.nodes)
    sent = sum(nd.bytes_sent for nd in sim.nodes)
    streams = sim.stream_bytes
    sim.max_packet = 0
    sim.run_until(warm + window)
    scale = n * window
    return (
        (sum(nd.packets_sent for nd in sim.nodes) - packets) / scale,
        (sum(nd.bytes_sent for nd in sim.nodes) - sent) / scale,
        (sim.stream_bytes - streams) / scale,
        sim.max_packet,
    )


def s7(p: Params) -> Result:
    r = Result("S7", "quiescent load per node")
    small = max(10, p.n // 10)
    big = _load(p, p.n, p.first_seed)
    little = _load(p, small, p.first_seed)
    r.add(f"packets/s per node, N={p.n}", f"{big[0]:.2f}", "≤ 3", big[0] <= 3.0)
    r.add(f"packets/s per node, N={small}", f"{little[0]:.2f}", "≤ 3", little[0] <= 3.0)
    ratio = big[0] / little[0] - 1
    r.add(f"N={p.n} vs N={small} packet rate", f"{ratio:+.1%}", "within ±15%", abs(ratio) <= 0.15)
    r.add("largest datagram (bytes)", str(max(big[3], little[3])), "≤ 1400", max(big[3], little[3]) <= 1400)
    r.add(f"UDP bytes/s per node, N={p.n}", f"{big[1]:.0f}")
    r.add(f"push-pull stream bytes/s per node, N={p.n}", f"{big[2]:.0f}")
    return r


def s8_determinism(p: Params) -> Result:
    """S8's half that holds on any machine: a seed fixes the whole run. The unit tests assert
    this half only; how fast a run is depends on the machine and its load, so it is a figure
    the benchmark reports against its target (``s8``), never a test's verdict."""
    r = Result("S8", "determinism and speed")
    small = Params(n=min(p.n, 100), seeds=1, config=p.config)

    def traced(seed: int) -> str:
        sim = Simulator(p.config, seed, p.net(0.05), trace=True)
        nodes = [sim.add_node() for _ in range(small.n)]
        sim.bootstrap(nodes)
        sim.at(10.0, lambda: sim.crash(nodes[3]))
        sim.run_until(60.0)
        return sim.trace_hash

    a, b, c = traced(p.first_seed), traced(p.first_seed), traced(p.first_seed + 1)
    r.add("same seed → same trace hash", "yes" if a == b else "NO", "yes", a == b)
    r.add("other seed → other trace hash", "yes" if a != c else "NO", "yes", a != c)
    return r


def s8(p: Params) -> Result:
    r = s8_determinism(p)
    t0 = time.perf_counter()
    sim = formed(p, p.first_seed, p.net())
    sim.run_until(p.duration_s)
    wall = time.perf_counter() - t0
    limit = 60.0 * p.duration_s / 600.0
    r.add(
        f"wall, N={p.n} quiescent × {p.duration_s:.0f} simulated s (s)",
        f"{wall:.1f}",
        f"≤ {limit:.0f}",
        wall <= limit,
    )
    t0 = time.perf_counter()
    detect(p, p.first_seed, p.net(0.01), p.config, horizon=120.0)
    wall = time.perf_counter() - t0
    r.add(f"wall, S1 at N={p.n} (s)", f"{wall:.1f}", "≤ 30", wall <= 30.0)
    return r


SCENARIOS: dict[str, Callable[[Params], Result]] = {
    "S1": s1,
    "S2": s2,
    "S3": s3,
    "S4": s4,
    "S5": s5,
    "S6": s6,
    "S7": s7,
    "S8": s8,
}
