"""Timings and limits of the SWIM protocol, with the ``lan`` and ``fast`` profiles.

``lan`` is memberlist's DefaultLANConfig. ``fast`` divides
the times by ten for loopback tests and demos and keeps every multiplier. Every field can
be overridden: ``SwimConfig.profile("fast", probe_timeout_s=0.03)``.

Fields that memberlist does not have, and why:

* ``nack_timeout_ratio``: a helper answers ``Nack`` after this share of ``probe_timeout_s``
  (the Lifeguard paper's 80 %), so that the nack reaches the prober before its round
  deadline; memberlist waits the whole probe timeout, which makes the nack arrive just
  after the deadline of a 1 s round.
* ``dead_reclaim_s``: memberlist forgets a dead member ``gossip_to_dead_s`` after its death,
  after which the name may come back from any address. Kapok keeps dead members (they show
  in ``/cluster/nodes`` and are tried for reconnection by push-pull), so the address guard
  is lifted after the same time instead.
* ``forget_dead_s``: dead and left members are dropped from the table after this long.
* ``join_retry_s``: while a node knows no live peer it re-sends its join to the seeds.
* ``reconnect_interval_s``: every so often, push-pull with one random *dead* member (Serf's
  reconnect, which memberlist leaves to its user). A member declared dead across a partition
  hears about it this way once the network heals, refutes, and both sides merge again.
* ``tcp_pings`` is memberlist's ``DisableTcpPings`` the other way round (on by default in
  both profiles): when the direct ping goes unanswered, the target is also pinged over a
  stream, alongside the indirect probes, and its ack clears the round like a direct one.
  TCP retransmits what the network drops, so datagram loss alone makes a live member
  suspect far less often (at 10 % loss, in the simulator: about 5× fewer accusations).
* ``lifeguard``: False gives plain SWIM (fixed suspicion timeout at the minimum, no local
  health scaling, no nacks, no buddy suspect), for comparison runs in the simulator.

A node's configuration may override each field under ``cluster.tuning`` (``kapok.config``
derives those keys from this class) except the ones marked ``_fixed``: wire limits every
member must share, and switches for comparison runs. A field's metadata bounds a value
given there on its own: ``gt`` (``_positive``) or ``lo`` (``_at_least_one``), else the
non-negative rule below; the rules across fields stay in ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

__all__ = ["FAST", "LAN", "PROFILES", "SwimConfig"]

T = TypeVar("T")


def _positive(default: T) -> T:
    return field(default=default, metadata={"gt": 0})


def _at_least_one(default: T) -> T:
    return field(default=default, metadata={"lo": 1})


def _fixed(default: T) -> T:
    """Not a ``cluster.tuning`` key."""
    return field(default=default, metadata={"tunable": False})


@dataclass(frozen=True, slots=True)
class SwimConfig:
    probe_interval_s: float = _positive(1.0)  # one probe per interval (times local health when probes fail)
    probe_timeout_s: float = _positive(0.5)  # wait for a direct ack before asking helpers
    indirect_checks: int = 3  # helpers asked to probe when the direct ping goes unanswered
    nack_timeout_ratio: float = _fixed(0.8)  # helper nacks after this share of probe_timeout_s
    suspicion_mult: int = _at_least_one(4)  # suspicion min = mult × max(1, log10 n) × probe interval
    suspicion_max_timeout_mult: int = _at_least_one(6)  # suspicion max = this × min
    awareness_max_multiplier: int = _at_least_one(8)  # local health score caps at this − 1
    gossip_interval_s: float = _positive(0.2)  # gossip tick (only when broadcasts are queued)
    gossip_nodes: int = _at_least_one(3)  # fan-out per gossip tick
    gossip_to_dead_s: float = 30.0  # dead members still receive gossip this long (to refute)
    retransmit_mult: int = _at_least_one(4)  # broadcasts are sent mult × ceil(log10(n + 1)) times
    push_pull_interval_s: float = _positive(30.0)  # anti-entropy period at ≤ 32 members (scaled above)
    dead_reclaim_s: float = 30.0  # after this long dead, a name may come back from a new address
    forget_dead_s: float = 3600.0  # dead and left members are dropped after this long
    join_retry_s: float = _positive(5.0)  # re-send the join while no live peer is known
    reconnect_interval_s: float = _positive(30.0)  # push-pull with a random dead member this often
    max_packet_bytes: int = _fixed(1400)  # UDP payload limit, header and tag included
    max_stream_bytes: int = _fixed(8 * 1024 * 1024)  # push-pull blob limit
    meta_max_bytes: int = _fixed(512)  # encoded NodeMeta limit
    tcp_pings: bool = _fixed(True)  # ping over a stream too when the direct ping times out
    lifeguard: bool = _fixed(True)  # False: plain SWIM (for comparison)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool):
                continue
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"SwimConfig.{f.name} must be a non-negative number, got {value!r}")
        if any(getattr(self, f.name) <= 0 for f in fields(self) if "gt" in f.metadata):
            raise ValueError("every interval and timeout must be > 0")
        if self.probe_timeout_s > self.probe_interval_s:
            raise ValueError("probe_timeout_s must not exceed probe_interval_s")
        if self.suspicion_mult < 1 or self.suspicion_max_timeout_mult < 1 or self.retransmit_mult < 1:
            raise ValueError("suspicion_mult, suspicion_max_timeout_mult and retransmit_mult must be ≥ 1")
        if self.max_packet_bytes < 512:
            raise ValueError("max_packet_bytes must be at least 512")
        if self.meta_max_bytes > self.max_packet_bytes // 2:
            raise ValueError("meta_max_bytes must leave room in a packet for a probe")

    @staticmethod
    def profile(name: str, **overrides: Any) -> SwimConfig:
        try:
            base = PROFILES[name]
        except KeyError:
            raise ValueError(f"unknown cluster profile {name!r} (known: {', '.join(PROFILES)})") from None
        return replace(base, **overrides) if overrides else base


LAN = SwimConfig()
FAST = SwimConfig(
    probe_interval_s=0.1,
    probe_timeout_s=0.05,
    gossip_interval_s=0.02,
    gossip_to_dead_s=3.0,
    push_pull_interval_s=2.0,
    dead_reclaim_s=3.0,
    forget_dead_s=360.0,
    join_retry_s=0.5,
    reconnect_interval_s=3.0,
)
PROFILES: dict[str, SwimConfig] = {"lan": LAN, "fast": FAST}
