"""The client's picture of the cluster, built from a node's answer (pure: no I/O).

``GET /cluster/nodes`` lists every gossip member. A client uses the members that are
*live* (alive or suspect: a suspect may still refute) and *active* (they take producers
and consumers: every master, and a slave once it has taken over). Those are grouped by
**pair identity**, the name of the pair's configured master, which every row carries as
``pair_id`` whatever the roles are now (for nodes that predate it: a master's own name, or
for a slave the ``pair`` it mirrors). A takeover therefore keeps the pair's identity, and whatever
the client tied to that pair (a key's messages, a batch in doubt, a subscription) moves
to the slave instead of to another shard. When two members of one pair both say they are
active (a master that has not yet learnt it was replaced), the higher ``epoch`` wins.

KapokMQ's registry answer (``POST /Registry/GetNodes``) lists live masters only, without
roles or epochs; each is its own pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Member", "by_pair", "live_pairs", "members_from_nodes", "members_from_registry"]

_LIVE = ("alive", "suspect")


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """An active node as the client sees it."""

    name: str
    url: str  # HTTP base URL, no trailing slash
    pair: str  # pair identity: the name of the pair's master
    epoch: int = 0
    load: float = 0.0
    role: str = "master"

    def same_node(self, other: Member) -> bool:
        """The same member at the same address and epoch (its load may differ)."""
        return (self.name, self.url, self.epoch) == (other.name, other.url, other.epoch)

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    return value if isinstance(value, str) else ""


def _number(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _pair_of(row: Mapping[str, Any], name: str, role: str) -> str:
    """A row's pair identity (see the module's docstring for rows that predate ``pair_id``)."""
    return _text(row, "pair_id") or (name if role == "master" else (_text(row, "pair") or name))


def members_from_nodes(rows: Iterable[Any]) -> list[Member]:
    """The live, active members of a ``/cluster/nodes`` answer; malformed rows are skipped."""
    out = []
    for row in rows:
        if not isinstance(row, dict) or row.get("state") not in _LIVE:
            continue
        role = _text(row, "role") or "master"
        # Rows of nodes that predate the ``active`` field: a master is active.
        active = row.get("active", role == "master")
        name, url = _text(row, "name"), _text(row, "http_url").rstrip("/")
        if active is not True or not name or not url.startswith(("http://", "https://")):
            continue
        pair = _pair_of(row, name, role)
        epoch = row.get("epoch")
        epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0
        out.append(Member(name, url, pair, epoch, _number(row, "load"), role))
    return out


def live_pairs(rows: Iterable[Any]) -> set[str]:
    """The pair identities with a live member, active or not: a pair whose master died and
    whose slave has not yet taken over is still here (``balance="key"`` keeps its keys)."""
    out = set()
    for row in rows:
        if isinstance(row, dict) and row.get("state") in _LIVE:
            pair = _pair_of(row, _text(row, "name"), _text(row, "role") or "master")
            if pair:
                out.add(pair)
    return out


def members_from_registry(rows: Iterable[Any]) -> list[Member]:
    """Serena's registry format, ``[{"Name": "mq:host:port", "Addr": host, "Port": "8011"}]``."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        addr, port = _text(row, "Addr"), row.get("Port")
        if not addr or not isinstance(port, str | int) or not str(port).isdigit():
            continue
        host = f"[{addr}]" if ":" in addr else addr
        name = _text(row, "Name").removeprefix("mq:") or f"{host}:{port}"
        out.append(Member(name, f"http://{host}:{port}", name))
    return out


def by_pair(members: Iterable[Member]) -> dict[str, Member]:
    """One member per pair identity: the highest epoch; on a tie the master, then the name."""
    best: dict[str, Member] = {}
    for m in members:
        cur = best.get(m.pair)
        if cur is None or (m.epoch, m.role == "master", m.name) > (cur.epoch, cur.role == "master", cur.name):
            best[m.pair] = m
    return best
