"""Cluster membership: SWIM failure detection and gossip with Lifeguard.

Pure, sans-I/O modules (no asyncio, socket, time or random imports; ``now`` and a seeded
``random.Random`` are passed in): ``messages``, ``codec``, ``suspicion``, ``broadcasts``,
``config``, ``membertable``, ``membership``, ``swimstate``, ``swim``, ``droplog`` (when a
bad HMAC is worth a warning). The driver: ``node`` (UDP and TCP on asyncio). The
discrete-event simulator lives in ``kapok.testing.simnet``, the S1–S8 and R1–R5
benchmarks in ``kapok.bench.gossip_sim`` and ``kapok.bench.gossip_real``. Import what you
use from its module: importing this package loads nothing else.
"""
