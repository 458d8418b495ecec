"""Per-address back-off after wrong secret keys (pure: ``now`` is always an argument).

Every way of presenting the key shares one ``AuthThrottle``: the ``Authorization``
header of ``/v1`` and ``/sync/v1``, KapokMQ's ``secretKey`` header and WebSocket
handshake, and the console's login form. After ``after`` wrong keys from one address it
must wait ``first_s`` seconds, and twice as long after each wrong key that follows, up
to ``max_s``. While it waits no key from it is even compared (so the wait cannot be used
to guess faster), and a right key afterwards forgets its record, and so do ``max_s``
quiet seconds after its last wait. A brute force from one address thus gets a few dozen
tries an hour instead of thousands a second, while another address (the real clients) is
not affected at all.

IPv6 addresses are grouped by their /64 prefix, which one host usually owns whole. The
table is bounded: past ``max_addresses`` the least recently failing address is forgotten
(an attacker with that many addresses is not stopped by a per-address limit anyway).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["AuthThrottle", "address_key"]


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


@dataclass(slots=True)
class _Record:
    failures: int = 0
    blocked_until: float = 0.0
    last_failed: float = 0.0


class AuthThrottle:
    def __init__(self, after: int, first_s: float, max_s: float, max_addresses: int = 100_000) -> None:
        self.after = after
        self.first_s = first_s
        self.max_s = max_s
        self.max_addresses = max_addresses
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self.blocked_total = 0  # tries refused without looking at the key (a metric)

    def __len__(self) -> int:
        return len(self._records)

    def wait_s(self, addr: str, now: float) -> float:
        """Seconds ``addr`` must still wait before a key from it is looked at (0: go on).
        A positive answer counts as a refused try."""
        record = self._records.get(address_key(addr))
        if record is None or record.blocked_until <= now:
            return 0.0
        self.blocked_total += 1
        return record.blocked_until - now

    def failed(self, addr: str, now: float) -> None:
        key = address_key(addr)
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = _Record()
            while len(self._records) > self.max_addresses:
                self._records.popitem(last=False)
        else:
            self._records.move_to_end(key)
            if now - max(record.last_failed, record.blocked_until) > self.max_s:
                record.failures = 0  # quiet long enough: start afresh
        record.last_failed = now
        record.failures += 1
        over = record.failures - self.after + 1  # the after-th wrong key brings the first wait
        if over > 0:
            # 2 ** over grows past max_s long before it could overflow a float
            wait = min(self.max_s, self.first_s * 2 ** min(over - 1, 64))
            record.blocked_until = now + wait

    def succeeded(self, addr: str) -> None:
        self._records.pop(address_key(addr), None)
