"""The stream source's picture of the cluster: every master pair and its nodes (driver side).

A topic that ``kapok produce`` spreads over the masters has a share on each master pair,
so the source reads every pair. A pair is named by its identity (the name of its
configured master, ``pair_id`` in ``GET /cluster/nodes``), which a takeover keeps: the
pair's slave answers for it while it is active, its master again after the give-back.
What the view says is parsed by the client's own pure functions (``kapok.client.view``);
only the asking is done here, with blocking HTTP (the source runs in Spark's Python
processes, which have no event loop).

``pairs_from_nodes`` is pure: a pair's candidate URLs, the active member first, then
the pair's other live members, then the rest (a dead master may come back at its
address). ``ClusterView.refresh`` asks the members it knows, then the seeds, and keeps
the first good answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kapok.analytics.pull import NodeClient
from kapok.client.discovery import normalize_seeds
from kapok.client.view import Member, by_pair, members_from_nodes
from kapok.errors import AnalyticsError, KapokError

__all__ = ["ClusterView", "Pair", "pairs_from_nodes"]

_LIVE: Final = ("alive", "suspect")


@dataclass(frozen=True, slots=True)
class Pair:
    """A master pair as the source sees it: ``urls`` active member first; ``active`` its
    name (empty while no member takes clients, e.g. during a takeover) and ``epoch``."""

    name: str
    urls: tuple[str, ...]
    active: str = ""
    epoch: int = 0

    @property
    def active_url(self) -> str | None:
        return self.urls[0] if self.active else None


def _every_member(rows: Sequence[Any]) -> list[tuple[Member, bool]]:
    """Every row with an address as a ``Member`` (pair identity as the client computes it:
    ``members_from_nodes`` on the row taken as live and active), with whether it is live."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        found = members_from_nodes([{**row, "state": "alive", "active": True}])
        if found:
            out.append((found[0], row.get("state") in _LIVE))
    return out


def pairs_from_nodes(rows: Iterable[Any]) -> dict[str, Pair]:
    """The pairs of a ``/cluster/nodes`` answer by name; malformed rows are skipped."""
    rows = list(rows)
    active = by_pair(members_from_nodes(rows))
    urls: dict[str, list[tuple[int, str]]] = {}
    for member, live in _every_member(rows):
        lead = active.get(member.pair)
        rank = 0 if lead is not None and lead.same_node(member) else (1 if live else 2)
        urls.setdefault(member.pair, []).append((rank, member.url))
    out = {}
    for name, ranked in urls.items():
        ordered = list(dict.fromkeys(url for _, url in sorted(ranked, key=lambda item: item[0])))
        lead = active.get(name)
        out[name] = Pair(name, tuple(ordered), lead.name if lead else "", lead.epoch if lead else 0)
    return out


class ClusterView:
    """The pairs of the cluster, asked of a known member or a seed (blocking)."""

    def __init__(self, seeds: Sequence[str], timeout_s: float, rng: random.Random | None = None) -> None:
        try:
            self.seeds = normalize_seeds(seeds)
        except ValueError as exc:
            raise AnalyticsError(f"the kapok source: {exc}") from None
        self.timeout_s = timeout_s
        self.pairs: dict[str, Pair] = {}
        self._rng = rng or random.Random()

    def refresh(self) -> dict[str, Pair]:
        """The pairs of the first node that answers; ``AnalyticsError`` when none does."""
        known = [url for pair in self.pairs.values() for url in pair.urls]
        self._rng.shuffle(known)
        errors = []
        for url in dict.fromkeys([*known, *self.seeds]):
            try:
                with NodeClient(url, "", self.timeout_s) as node:
                    rows = node.cluster_nodes()
            except KapokError as exc:
                errors.append(f"{url}: {exc}")
                continue
            pairs = pairs_from_nodes(rows)
            if pairs:
                self.pairs = pairs
                return pairs
            errors.append(f"{url}: no member in its answer")
        raise AnalyticsError(
            "the kapok source: no node answered with its cluster view: " + "; ".join(errors[:3])
        )
