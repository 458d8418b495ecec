"""Small deterministic simulations: real ``Swim`` instances exchanging real, authenticated
packets through the discrete-event network (fake clock, seeded loss and delay)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

from kapok.cluster.config import FAST, LAN
from kapok.cluster.messages import State
from kapok.testing.simnet import Network, SimNode, Simulator


def views(sim: Simulator, about: str) -> dict[str, State | None]:
    """What every running node (other than ``about``) thinks of ``about``."""
    out: dict[str, State | None] = {}
    for nd in sim.live_nodes():
        if nd.name != about:
            st = nd.swim.member(about)
            out[nd.name] = None if st is None else st.state
    return out


def everyone_sees(sim: Simulator, about: str, state: State) -> bool:
    return all(v is state for v in views(sim, about).values())


def full_view(sim: Simulator, n: int) -> bool:
    return all(sum(st.state is State.ALIVE for st in nd.swim.members()) == n for nd in sim.live_nodes())


def formed(n: int, seed: int = 1, loss: float = 0.0, config: object = LAN) -> tuple[Simulator, list[SimNode]]:
    sim = Simulator(config, seed, Network(loss=loss))  # type: ignore[arg-type]
    nodes = [sim.add_node() for _ in range(n)]
    sim.bootstrap(nodes)
    return sim, nodes


def test_nodes_joining_through_one_seed_converge_under_loss() -> None:
    sim = Simulator(LAN, seed=3, network=Network(loss=0.05))
    nodes = [sim.add_node() for _ in range(40)]
    sim.start(nodes[0])
    for i, nd in enumerate(nodes[1:]):
        sim.at(0.1 * i, lambda nd=nd: sim.join(nd, [nodes[0]]))  # type: ignore[misc]
    sim.run_until(60.0, stop=lambda: full_view(sim, 40))
    assert full_view(sim, 40)
    assert sim.now < 30.0


def test_a_killed_node_is_declared_dead_by_all() -> None:
    sim, nodes = formed(30, seed=5, loss=0.01)
    sim.at(3.0, lambda: sim.crash(nodes[7]))
    sim.run_until(60.0, stop=lambda: everyone_sees(sim, "node-7", State.DEAD))
    assert everyone_sees(sim, "node-7", State.DEAD)
    # crash at 3 s; suspicion minimum at N=30 is 4 × log10(30) ≈ 5.9 s; plus probing
    assert 3.0 + 5.9 < sim.now < 3.0 + 15.0
    others = [nd.name for nd in nodes if nd.name != "node-7"]
    assert all(everyone_sees(sim, name, State.ALIVE) for name in others)  # no false deaths


def test_a_graceful_leave_shows_as_left_and_the_name_can_come_back() -> None:
    sim, nodes = formed(20, seed=7)
    leaver = nodes[4]
    sim.at(2.0, lambda: sim.leave(leaver))
    sim.run_until(10.0, stop=lambda: leaver.swim.leave_done and everyone_sees(sim, "node-4", State.LEFT))
    assert leaver.swim.leave_done
    assert everyone_sees(sim, "node-4", State.LEFT)
    left_at = sim.nodes[0].swim.member("node-4").incarnation  # type: ignore[union-attr]
    sim.crash(leaver)  # the process exits
    sim.run_until(sim.now + 5.0)
    sim.restart(leaver, [nodes[0]])  # a new process with the same name, incarnation 0
    sim.run_until(sim.now + 10.0, stop=lambda: everyone_sees(sim, "node-4", State.ALIVE))
    assert everyone_sees(sim, "node-4", State.ALIVE)
    assert leaver.swim.incarnation > left_at


def test_a_crashed_node_restarting_refutes_its_death() -> None:
    sim, nodes = formed(20, seed=8)
    victim = nodes[2]
    sim.at(1.0, lambda: sim.crash(victim))
    sim.run_until(40.0, stop=lambda: everyone_sees(sim, "node-2", State.DEAD))
    assert everyone_sees(sim, "node-2", State.DEAD)
    sim.restart(victim, [nodes[9]])
    sim.run_until(sim.now + 10.0, stop=lambda: everyone_sees(sim, "node-2", State.ALIVE))
    assert everyone_sees(sim, "node-2", State.ALIVE)
    assert victim.swim.incarnation >= 1


def test_a_node_with_the_wrong_key_is_never_admitted() -> None:
    sim, nodes = formed(10, seed=9)
    intruder = sim.add_node(secret="not-the-cluster-secret")
    sim.join(intruder, [nodes[0], nodes[1]])
    sim.run_until(60.0)
    assert all(v is None for v in views(sim, intruder.name).values())
    assert [st.name for st in intruder.swim.members()] == [intruder.name]
    dropped = sum(nd.swim.stats["drop_auth"] for nd in nodes)
    assert dropped >= 2  # at least its join streams, counted where they arrived


def test_partition_then_heal_with_the_fast_profile() -> None:
    sim, nodes = formed(24, seed=11, loss=0.01, config=FAST)
    sim.run_until(1.0)
    sim.set_partition({nd.index: nd.index % 2 for nd in nodes})
    sim.run_until(8.0)
    assert all(
        nd.swim.member(other.name).state is State.DEAD  # type: ignore[union-attr]
        for nd in nodes
        for other in nodes
        if nd.index % 2 != other.index % 2
    )
    sim.set_partition(None)
    sim.run_until(60.0, stop=lambda: full_view(sim, 24))
    assert full_view(sim, 24)
    assert sim.now < 8.0 + 2 * 2 * FAST.push_pull_interval_s


def test_same_seed_same_trace() -> None:
    def trace(seed: int) -> str:
        sim = Simulator(LAN, seed, Network(loss=0.05), trace=True)
        nodes = [sim.add_node() for _ in range(25)]
        sim.bootstrap(nodes)
        sim.at(2.0, lambda: sim.crash(nodes[3]))
        sim.run_until(30.0)
        return sim.trace_hash

    assert trace(1) == trace(1)
    assert trace(1) != trace(2)


def test_packets_never_exceed_the_limit_during_formation() -> None:
    sim = Simulator(LAN, seed=4, network=Network())
    nodes = [sim.add_node() for _ in range(120)]
    sim.start(nodes[0])
    for nd in nodes[1:]:
        sim.join(nd, [nodes[0]])
    sim.run_until(20.0)
    assert 1000 < sim.max_packet <= LAN.max_packet_bytes


def test_trace_does_not_depend_on_the_interpreter_hash_seed() -> None:
    """Nothing iterates a set or dict in an order that string hashing could change."""
    code = (
        "from kapok.cluster.config import LAN\n"
        "from kapok.testing.simnet import Simulator, Network\n"
        "sim = Simulator(LAN, 1, Network(loss=0.05), trace=True)\n"
        "nodes = [sim.add_node() for _ in range(30)]\n"
        "sim.bootstrap(nodes)\n"
        "sim.at(2.0, lambda: sim.crash(nodes[3]))\n"
        "sim.at(5.0, lambda: sim.set_partition({n.index: n.index % 2 for n in nodes}))\n"
        "sim.at(30.0, lambda: sim.set_partition(None))\n"
        "sim.run_until(60.0)\n"
        "print(sim.trace_hash)\n"
    )
    hashes = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(h)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for h in (1, 2)
    }
    assert len(hashes) == 1


def test_streams_are_late_under_loss_but_never_lost() -> None:
    """A stream stands for a TCP connection: loss costs retransmission timeouts, not the blob."""
    arrivals = []
    for seed in range(30):
        sim = Simulator(LAN, seed, Network(loss=0.3).with_linux_rto())
        seed_node, joiner = sim.add_node(), sim.add_node()

        def known(s: SimNode = seed_node, j: SimNode = joiner) -> bool:
            return s.swim.member(j.name) is not None

        sim.start(seed_node)
        sim.join(joiner, [seed_node])  # one push-pull stream to the seed
        sim.run_until(LAN.join_retry_s - 0.01, stop=known)
        arrivals.append(sim.now if known() else float("inf"))
        assert sim.streams_retransmitted <= sim.streams
    assert min(arrivals) < 0.01  # no segment lost: three one-way delays
    assert any(1.0 <= t < 5.0 for t in arrivals)  # a lost SYN or SYN-ACK: 1 s later
    assert sum(t < 5.0 for t in arrivals) >= 25  # the rest wait for longer backoffs, not forever


def test_stream_pings_keep_live_members_from_being_suspected_under_heavy_loss() -> None:
    def run(tcp_pings: bool, network: Network) -> tuple[int, int]:
        sim = Simulator(replace(LAN, tcp_pings=tcp_pings), 12, network)
        nodes = [sim.add_node() for _ in range(30)]
        sim.bootstrap(nodes)
        sim.run_until(120.0)
        stats = [nd.swim.stats for nd in nodes]
        return sum(s["probe_failures"] for s in stats), sum(s["stream_ping_saves"] for s in stats)

    lossy = Network(loss=0.10)
    failures_off, saves_off = run(False, lossy)
    failures_on, saves_on = run(True, lossy)
    assert saves_off == 0 and saves_on > 0
    assert failures_off > 10 and failures_on == 0  # streams that loss never delays always get through
    # With TCP retransmission timeouts a lost SYN or SYN-ACK costs 1 s, more than is left of
    # the round: those fallback pings come too late, hence only a few times fewer failures.
    failures_rto, _ = run(True, lossy.with_linux_rto())
    assert failures_rto * 2 < failures_off
