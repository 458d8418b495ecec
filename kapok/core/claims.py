"""Claims: named pull leases that a replayed batch can fetch again and ack as a whole.

Theory of operation. Kapok is a queue, not a log: a pulled message is leased, and
acked or given back. A reader that must deliver each message exactly once into an
idempotent sink, and may replay a batch after a crash of its own (a Spark stream
source), needs to fetch *the same* messages again: it names its pull with a
*claim*. The first pull under a claim leases ready messages as any pull does and
tags them with the claim; while any of them is still in flight, a pull under that
claim answers exactly those (their leases renewed), never new ones; an ack by
claim settles all of them at once.

An entry leaves its claim when it leaves the flight: settled (ack, nack,
reject), its lease ended (requeued), its message deleted, expired or dropped.
A claim with no entry left is forgotten. Claims are durable: the ``Delivered``
record of a claimed delivery carries the claim and the lease length, so
recovery and a slave's takeover lease the entry again under its claim (a fresh
lease of that length) instead of requeueing it (``kapok.core.replay``).

Cost: a group holds no ``Claims`` until its first claim (``Group.claims`` is
None), so unclaimed pulls and push consumers pay nothing but that None test on
the paths where a claimed entry can leave (group settles, lease ends, message
ends); the push consumers' own acks never test it (a claimed entry is always
held by the group's pull lessee).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from kapok.core.model import Entry
from kapok.errors import BadRequestError

__all__ = ["CLAIM_RE", "MAX_CLAIM_CHARS", "Claim", "Claims", "check_claim"]

MAX_CLAIM_CHARS: Final = 200
CLAIM_RE: Final = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def check_claim(claim: object) -> str:
    """``claim`` if it is a valid claim name, else ``BadRequestError``."""
    if not isinstance(claim, str) or CLAIM_RE.fullmatch(claim) is None:
        raise BadRequestError(
            f"a claim must be 1 to {MAX_CLAIM_CHARS} characters among letters, digits and '._:-'"
        )
    return claim


class Claim:
    """The entries in flight under one name, in the order they were first leased."""

    __slots__ = ("entries", "lease_s", "name")

    def __init__(self, name: str, lease_s: float) -> None:
        self.name = name
        self.lease_s = lease_s  # the length of the latest lease (recovery leases again for it)
        self.entries: dict[Entry, None] = {}  # an ordered set: leaving is O(1)

    def __repr__(self) -> str:
        return f"Claim({self.name!r}, {len(self.entries)} entries, lease_s={self.lease_s})"


class Claims:
    """One group's claims: by name, and the claim of each claimed entry."""

    __slots__ = ("by_name", "of")

    def __init__(self) -> None:
        self.by_name: dict[str, Claim] = {}
        self.of: dict[Entry, Claim] = {}

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Claim | None:
        return self.by_name.get(name)

    def add(self, name: str, lease_s: float, entries: Iterable[Entry]) -> Claim:
        """Put ``entries`` under the claim ``name`` (made if new), each leaving its former claim."""
        claim = self.by_name.get(name)
        if claim is None:
            claim = self.by_name[name] = Claim(name, lease_s)
        claim.lease_s = lease_s
        of = self.of
        for entry in entries:
            former = of.get(entry)
            if former is claim:
                continue
            if former is not None:
                self.leave(entry)
            of[entry] = claim
            claim.entries[entry] = None
        return claim

    def leave(self, entry: Entry) -> None:
        """``entry`` is no longer in flight under its claim (if it had one)."""
        claim = self.of.pop(entry, None)
        if claim is not None:
            del claim.entries[entry]
            if not claim.entries:
                del self.by_name[claim.name]

    def take(self, name: str) -> list[Entry]:
        """Forget the claim ``name``; returns its entries (none: an unknown claim)."""
        claim = self.by_name.pop(name, None)
        if claim is None:
            return []
        of = self.of
        for entry in claim.entries:
            del of[entry]
        return list(claim.entries)
