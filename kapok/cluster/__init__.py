"""Cluster membership: SWIM failure detection and gossip with Lifeguard (SPEC §6).

Pure, sans-I/O modules (no asyncio, socket, time or random imports; ``now`` and a seeded
``random.Random`` are passed in): ``messages``, ``codec``, ``suspicion``, ``broadcasts``,
``config``, ``membership``, ``swim``, ``droplog`` (when a bad HMAC is worth a warning).
Drivers: ``node`` (UDP and TCP on asyncio), ``simnet`` (discrete-event simulator),
``scenarios`` and ``sim`` (the S1–S8 benchmark, ``python -m kapok.cluster.sim``). Import
what you use from its module: importing this package loads nothing else.
"""
