"""Where a message goes: the producer's load balancer (pure; randomness is injected).

``random``  each message to a uniformly chosen pair (the product's design: independent
            draws, so the masters' shares are multinomial and no state is shared).
``p2c``     power of two choices: two distinct random pairs, the one with the lower cost,
            a figure the producer measures itself (``lanes.costs``: its latency to the
            pair times what it has placed there and not yet settled).
``key``     rendezvous (highest-random-weight) hashing of the routing key over the pairs:
            one key, one pair, as long as that pair is in the view. When a pair leaves, only
            its keys move (each to its second-best pair); when one joins, it takes only the
            keys it now wins. A message without a key is placed at random.

Balancers work on *pair identities* (see ``view``), so a slave's takeover changes nothing.
The hash is BLAKE2b, not ``hash()``, which is salted per process: every producer of the
cluster must send a key to the same pair.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence

__all__ = ["BALANCES", "Balancer", "make_balancer", "rendezvous_score"]

BALANCES = ("random", "p2c", "key")

# pairs (non-empty), key, cost per pair (p2c only) -> the chosen pair
Balancer = Callable[[Sequence[str], str, Mapping[str, float]], str]


def rendezvous_score(pair: str, key: str) -> int:
    digest = hashlib.blake2b(pair.encode() + b"\0" + key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_balancer(name: str, rng: random.Random) -> Balancer:
    if name not in BALANCES:
        raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {name!r}")
    choice = rng.choice

    def pick_random(pairs: Sequence[str], key: str, loads: Mapping[str, float]) -> str:
        return choice(pairs)

    def pick_p2c(pairs: Sequence[str], key: str, loads: Mapping[str, float]) -> str:
        if len(pairs) == 1:
            return pairs[0]
        a, b = rng.sample(pairs, 2)
        la, lb = loads.get(a, 0.0), loads.get(b, 0.0)
        return a if la < lb or (la == lb and rng.random() < 0.5) else b

    def pick_key(pairs: Sequence[str], key: str, loads: Mapping[str, float]) -> str:
        if not key:
            return choice(pairs)
        return max(pairs, key=lambda pair: rendezvous_score(pair, key))

    return {"random": pick_random, "p2c": pick_p2c, "key": pick_key}[name]
