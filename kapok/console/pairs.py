"""The Cluster page's pair cards, from the gossip view's member rows: pure, no I/O.

A pair is named by its ``pair_id`` (its configured master's name), so a card keeps its
place and its name through a takeover, a hand-over and a give-back: the roles move
between its two nodes, the card does not. Each card says which node is active, at which
epoch, the state of the sync link between them, and whether the pair accepts writes.

Two sources, one rule each:

* the node serving the console knows its own pair first-hand (``local``: what
  ``kapok.server.routes.sync.pair_state`` returns, the same as ``/replication/state``), so its
  card shows the link as that node sees it, ``refused (wrong key)`` included;
* every other pair is judged from gossip metadata alone: the active node announces
  ``alone_since`` while it confirms writes without its partner; a reported lag means a
  follower session exists; anything else is a link down.

A node is shown active only while gossip holds it ``alive`` or ``suspect``: a dead or
departed node's last metadata may still say ``active``, and that claim is stale by
definition (it takes no writes, whatever it said before it went).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["LIVE", "link_class", "pairs"]

LIVE: Final = ("alive", "suspect")  # gossip states of a member that may still serve

# What a leading node's ``replication`` (``/health``) says about the pair's writes.
_WRITES: Final = {
    "sync": ("yes", "sync: each write waits for {partner}"),
    "async": ("yes", "async: {partner} copies the log after the ack"),
    "unpaired": ("yes", "not paired: {name} holds the only copy"),
    "alone": ("alone", "{name} confirms writes alone since LSN {since}: {partner} is gone"),
}
# Why a node of the pair that should lead does not take writes (its protocol role).
_NOT_ACTIVE: Final = {
    "fenced": "{name} is fenced: cut off from its slave and from the majority of the cluster",
    "handing_over": "{name} is handing its role over to {partner}",
    "starting": "{name} is starting",
    "stopped": "{name} is stopping",
    "leader": "{name} is in doubt after a pause: it waits to hear from {partner}",
}


def link_class(link: str) -> str:
    """The colour family of a link state: ``refused (wrong key)`` is ``refused``."""
    return link.split(" ", 1)[0] if link else "down"


def _pair_id(row: dict[str, Any]) -> str:
    """The row's pair; rows of nodes that predate ``pair_id`` are grouped as clients do."""
    pair_id = row.get("pair_id")
    if isinstance(pair_id, str) and pair_id:
        return pair_id
    if row.get("role") == "slave" and row.get("pair"):
        return str(row["pair"])
    return str(row["name"])


def _live(row: dict[str, Any] | None) -> bool:
    return row is not None and row.get("state") in LIVE


def _claims_active(row: dict[str, Any]) -> bool:
    return row.get("active") is True and _live(row)


def _epoch(row: dict[str, Any]) -> int:
    epoch = row.get("epoch")
    return epoch if isinstance(epoch, int) else 0


def _split(pair_id: str, group: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes of a pair, the one that names it first, and the rows that no longer belong
    to it (a slave it had before it paired anew, still announcing the old pair)."""
    first, *rest = sorted(group, key=lambda r: (r["name"] != pair_id, not _live(r), -_epoch(r), r["name"]))
    partner = next((r for r in rest if r["name"] == first.get("pair")), None)
    if partner is None:  # the first does not name it (yet): it belongs while it names no other
        partner = next((r for r in rest if r.get("pair") in (None, first["name"])), None)
    if partner is None:
        return [first], rest
    return [first, partner], [r for r in rest if r is not partner]


def _gossip_link(active: dict[str, Any] | None, nodes: list[dict[str, Any]]) -> str:
    if active is not None and active.get("alone_since") is not None:
        return "alone"
    if len(nodes) < 2:
        lone = nodes[0]
        return "unpaired" if not lone.get("pair") and lone.get("role") != "slave" else "down"
    if all(_live(r) for r in nodes) and any(r.get("lag") for r in nodes):
        return "up"
    return "down"


def _local_link(local: dict[str, Any]) -> str:
    link = str(local.get("link") or "down")
    if link == "down" and local.get("partner") is None and local.get("role") != "follower":
        return "unpaired"  # a leader with no partner has no link to be down
    return link


def _writes(
    active: dict[str, Any] | None,
    nodes: list[dict[str, Any]],
    local: dict[str, Any] | None,
) -> tuple[str, str]:
    """Whether the pair takes writes now (``yes``, ``alone``, ``no``) and why."""
    names = [r["name"] for r in nodes]
    known = local.get("partner") if local is not None else None

    def partner_of(name: str) -> str:
        return next((n for n in names if n != name), str(known) if known else "its partner")

    if active is not None:
        name = active["name"]
        if local is not None and local.get("node") == name:
            mode, since = str(local.get("replication")), local.get("alone_since")
        else:
            since = active.get("alone_since")
            mode = "alone" if since is not None else ("" if len(nodes) > 1 else "unpaired")
        writes, note = _WRITES.get(mode, ("yes", "{name} is active"))
        return writes, note.format(name=name, partner=partner_of(name), since=since)
    if local is not None and local.get("role") in _NOT_ACTIVE:
        name = str(local.get("node"))
        return "no", _NOT_ACTIVE[str(local["role"])].format(name=name, partner=partner_of(name))
    up = [r for r in nodes if _live(r)]
    if not up:
        return "no", "no node of the pair is alive"
    down = [r for r in nodes if not _live(r)]
    if down:
        gone, there = down[0], up[0]
        then = "has not taken over (yet)" if there.get("role") == "slave" else "is not active"
        return "no", f"{gone['name']} is {gone.get('state')}; {there['name']} {then}"
    if len(nodes) == 1 and nodes[0].get("role") == "slave":
        return "no", f"{names[0]} is a slave not paired with a master"
    return "no", "no node of the pair is active (a failover or a fence is under way)"


def _card(pair_id: str, nodes: list[dict[str, Any]], local: dict[str, Any] | None) -> dict[str, Any]:
    claims = sorted((r for r in nodes if _claims_active(r)), key=lambda r: (-_epoch(r), r["name"]))
    active = claims[0] if claims else None
    # A dead node's "alone" is as stale as its "active": only the active node confirms alone.
    alone = active is not None and active.get("alone_since") is not None
    shown = [{**r, "active": r is active, "alone": alone and r is active} for r in nodes]
    mine = local if local is not None and local.get("node") in {r["name"] for r in nodes} else None
    link = _local_link(mine) if mine is not None else _gossip_link(active, nodes)
    writes, note = _writes(active, nodes, mine)
    epoch = _epoch(active) if active is not None else max(_epoch(r) for r in nodes)
    lag = None
    if link == "up":
        lag = mine.get("lag") if mine is not None else None
        lag = lag or next((r["lag"] for r in sorted(nodes, key=lambda r: r is active) if r.get("lag")), None)
    return {
        "id": pair_id,
        "first": shown[0],
        "second": shown[1] if len(shown) > 1 else None,
        "active": active["name"] if active is not None else None,
        "epoch": epoch,
        "link": link,
        "link_class": link_class(link),
        "writes": writes,
        "writes_note": note,
        "lag": lag,
        "in_sync": mine.get("in_sync") if mine is not None else None,
        "local": mine is not None,
    }


def pairs(rows: list[dict[str, Any]], local: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Member rows (``/cluster/nodes``) as pair cards, this node's pair first, then by name.

    ``first`` is the node that names the pair (its configured master) when it is in the
    view, ``second`` its partner (None: no partner in the view). ``local`` is the serving
    node's own ``pair_state``; without it every pair is judged from gossip alone.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(_pair_id(row), []).append(row)
    cards = []
    for pair_id, group in groups.items():
        kept, strays = _split(pair_id, group)
        cards.append(_card(pair_id, kept, local))
        cards.extend(_card(r["name"], [r], local) for r in strays)
    return sorted(cards, key=lambda c: (not c["local"], c["id"]))
