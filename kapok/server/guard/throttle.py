"""Per-address back-off after wrong secret keys (pure: ``now`` is always an argument).

Every way of presenting the key shares one ``AuthThrottle``: the ``Authorization``
header of ``/v1`` and ``/sync/v1``, KapokMQ's ``secretKey`` header and WebSocket
handshake, and the console's login form. The caller compares every key (in constant
time) and asks ``judge`` what to answer: ``Accept``, ``Reject`` (401, after
``delay_s``) or ``Blocked`` (429 with Retry-After). The caller does the waiting.

Theory of operation. What has to be slow is how fast one address can *test* keys. A
late 401 alone does not do that: a right key is served at once, so a guesser need not
wait for the 401 at all (no 200 within a round trip already says "wrong"). What does is
a bound on the keys an address may have compared:

* A key the address already sent and got wrong (one of its last ``remember``), or no key
  at all, tells nobody anything: 401 at once, nothing else changes. That is all a
  misconfigured peer sends (a slave with an old key retrying once a second, clients
  after a key rotation), so it never slows down the right key from its address.
* Any other key counts. The first ``after`` new wrong keys are answered at once;
  each later one holds one of the address's ``max_pending`` slots for its back-off
  (``first_s``, doubling with each new wrong key, up to ``max_s``), whether or not its
  sender waits, and its 401 is sent when the slot frees. So the answers an address has
  waiting are its held slots: at most ``max_pending`` of them.
* While every slot is held, any other key from the address is refused whatever it is
  (the comparison is not heeded): 429 ``auth_blocked``, Retry-After until the first slot
  frees (``blocked_total`` counts these). The right key included: if it passed, every
  429 would say "wrong" at once, and many keys sent in parallel would be tested as fast
  as the network carries them. This is the one case where a right key waits, and it
  takes ``max_pending`` new wrong keys within a back-off: a guesser on that address,
  whom no per-address rule can tell from a client sharing it.
* A right key is otherwise served at once, never waits behind wrong ones, and changes
  nothing (it does not forget the address: a client with the key on a guesser's
  address must not give the guesser fresh free tries).

The arithmetic. Past the free ones, at most ``max_pending`` keys are tested per back-off,
in parallel or not; once the back-off is at ``max_s``, that is ``max_pending`` per ``max_s``. With the
defaults (10 free, 1 s doubling to 300 s, 4 slots) an address gets at most 10 + 9 (the
doubling from 1 s to 256 s) + 4 x 12 = 67 tries in its first hour and 48 an hour after
that, instead of thousands a second. An address forgets its count after ``forget_s``
(an hour) without a new wrong key.

IPv6 addresses are grouped by their /64 prefix, which one host usually owns whole. The
table is bounded: past ``max_addresses`` the least recently failing address is forgotten
(an attacker with that many addresses is not stopped by a per-address limit anyway).
Wrong keys are remembered as keyed BLAKE2b fingerprints (a random key per process),
never as themselves.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["Accept", "AuthThrottle", "Blocked", "Reject", "Verdict", "address_key"]


def address_key(addr: str) -> str:
    """What the throttle counts failures by: an IPv4 address, or an IPv6 address's /64."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr  # a Unix socket or no address: one bucket
    if ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return str(mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass(frozen=True, slots=True)
class Accept:
    """The right key: serve the request now."""


@dataclass(frozen=True, slots=True)
class Reject:
    """A wrong (or missing) key: answer 401 after ``delay_s`` seconds (0: at once)."""

    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Blocked:
    """Refused without looking at the key: 429, retry after ``retry_after_s`` seconds."""

    retry_after_s: float


Verdict = Accept | Reject | Blocked


@dataclass(slots=True)
class _Record:
    guesses: int = 0  # new wrong keys since the address was last quiet for forget_s
    busy_until: float = 0.0  # its latest new wrong key, or when that key's slot frees
    slots: list[float] = field(default_factory=list)  # when each held slot frees
    known: list[bytes] = field(default_factory=list)  # its last wrong keys' fingerprints


class AuthThrottle:
    def __init__(
        self,
        after: int,
        first_s: float,
        max_s: float,
        max_addresses: int = 100_000,
        *,
        max_pending: int = 4,
        remember: int = 4,
        forget_s: float = 3600.0,
        salt: bytes | None = None,
    ) -> None:
        self.after = after
        self.first_s = first_s
        self.max_s = max_s
        self.max_addresses = max_addresses
        self.max_pending = max_pending
        self.remember = remember
        self.forget_s = forget_s
        self._salt = os.urandom(16) if salt is None else salt
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self.blocked_total = 0  # tries refused without looking at the key (a metric)

    def __len__(self) -> int:
        return len(self._records)

    def pending(self, addr: str, now: float) -> int:
        """How many of ``addr``'s slots are held (its 401s still waiting)."""
        record = self._records.get(address_key(addr))
        return 0 if record is None else sum(1 for until in record.slots if until > now)

    def judge(self, addr: str, key: str | None, right: bool, now: float) -> Verdict:
        """What to answer ``key`` from ``addr``; ``right``: the caller's constant-time
        comparison of ``key`` with the secret, heeded only while the address has a free
        slot (see the module's docstring)."""
        if key is None:
            return Reject()
        name = address_key(addr)
        record = self._records.get(name)
        raw = key.encode("utf-8", "surrogatepass")
        fingerprint = hashlib.blake2b(raw, digest_size=16, key=self._salt).digest()
        if record is not None:
            if fingerprint in record.known:  # never the right key: only wrong ones get in
                self._records.move_to_end(name)
                return Reject()
            record.slots = [until for until in record.slots if until > now]
            if len(record.slots) >= self.max_pending:
                self.blocked_total += 1
                return Blocked(min(record.slots) - now)
        if right:
            return Accept()
        if record is None:
            record = self._records[name] = _Record()
            while len(self._records) > self.max_addresses:
                self._records.popitem(last=False)
        else:
            self._records.move_to_end(name)
            if now - record.busy_until > self.forget_s:
                record.guesses = 0
        record.known.append(fingerprint)
        if len(record.known) > self.remember:
            del record.known[0]
        record.guesses += 1
        over = record.guesses - self.after
        if over <= 0:
            record.busy_until = max(record.busy_until, now)
            return Reject()
        # 2 ** over grows past max_s long before it could overflow a float
        delay = min(self.max_s, self.first_s * 2 ** min(over - 1, 64))
        record.slots.append(now + delay)
        record.busy_until = max(record.busy_until, now + delay)
        return Reject(delay)
