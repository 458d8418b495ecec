"""The Cluster page's pair cards from member rows (``kapok.console.pairs``): a pair keeps its
name and its places through failovers, a dead node is never active, and the link and the
writes say up / down / refused / alone as the serving node or gossip tells them."""

from __future__ import annotations

from typing import Any

from kapok.console.pairs import link_class, pairs

LAG = {"records": 3, "bytes": 300, "seconds": 0.5}


def node(
    name: str,
    role: str = "master",
    *,
    pair: str | None = None,
    pair_id: str | None = None,
    state: str = "alive",
    active: bool | None = None,
    epoch: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """A ``/cluster/nodes`` row (what ``member_rows`` serves)."""
    return {
        "name": name, "role": role, "pair": pair, "pair_id": pair_id or name, "state": state,
        "active": role == "master" if active is None else active, "epoch": epoch, "lag": None,
        "alone_since": None, **extra,
    }  # fmt: skip


def local(name: str, role: str = "leader", **extra: Any) -> dict[str, Any]:
    """What ``pair_state`` says for the node serving the console."""
    return {
        "node": name, "role": role, "active": role == "leader", "epoch": 1, "partner": None,
        "link": "down", "replication": "none", "alone_since": None, "in_sync": None, "lag": None, **extra,
    }  # fmt: skip


def sides(card: dict[str, Any]) -> tuple[str | None, str | None]:
    first, second = card["first"], card["second"]
    return (first and first["name"], second and second["name"])


def shown_active(cards: list[dict[str, Any]]) -> list[str]:
    return [side["name"] for c in cards for side in (c["first"], c["second"]) if side and side["active"]]


def test_a_pair_is_grouped_by_its_pair_id_with_its_configured_master_first() -> None:
    rows = [
        node("s1", "slave", pair="m1", pair_id="m1", active=False, lag=LAG),
        node("m2"),
        node("m1", pair="s1", lag=LAG),
    ]
    cards = pairs(rows)
    assert [(c["id"], sides(c)) for c in cards] == [("m1", ("m1", "s1")), ("m2", ("m2", None))]
    m1, m2 = cards
    assert (m1["active"], m1["epoch"], m1["link"], m1["writes"], m1["lag"]) == ("m1", 1, "up", "yes", LAG)
    assert m1["writes_note"] == "m1 is active" and not m1["local"]
    assert (m2["link"], m2["writes"], m2["lag"]) == ("unpaired", "yes", None)
    assert "m2 holds the only copy" in m2["writes_note"]


def test_a_dead_node_is_never_shown_active_whatever_its_last_metadata_said() -> None:
    rows = [
        node("m1", pair="s1", state="dead", active=True, lag=LAG),  # its last word, before it died
        node("s1", "slave", pair="m1", pair_id="m1", active=False, lag=LAG),
        node("m2", state="left", active=True, alone_since=9),  # it went while it confirmed alone
    ]
    cards = pairs(rows)
    assert shown_active(cards) == [] and [c["active"] for c in cards] == [None, None]
    assert cards[1]["first"]["alone"] is False and cards[1]["link"] != "alone"
    m1, m2 = cards
    assert (m1["link"], m1["writes"], m1["lag"]) == ("down", "no", None)  # no link to a dead node
    assert m1["writes_note"] == "m1 is dead; s1 has not taken over (yet)"
    assert (m2["writes"], m2["writes_note"]) == ("no", "no node of the pair is alive")
    suspect = pairs([node("m1", state="suspect")])
    assert shown_active(suspect) == ["m1"]  # a suspect may still refute: it may still serve


def test_a_pair_keeps_its_name_and_places_across_a_takeover_and_a_give_back() -> None:
    before = [
        node("m1", pair="s1", lag=LAG),
        node("s1", "slave", pair="m1", pair_id="m1", active=False),
    ]
    taken_over = [
        node("m1", pair="s1", state="dead", active=True),
        node("s1", "master", pair="m1", pair_id="m1", active=True, epoch=2),
    ]
    given_back = [
        node("m1", pair="s1", epoch=3, lag=LAG),
        node("s1", "slave", pair="m1", pair_id="m1", active=False, epoch=3, lag=LAG),
    ]
    views = [pairs(rows) for rows in (before, taken_over, given_back)]
    assert [[(c["id"], sides(c)) for c in cards] for cards in views] == [[("m1", ("m1", "s1"))]] * 3
    assert [(cards[0]["active"], cards[0]["epoch"]) for cards in views] == [("m1", 1), ("s1", 2), ("m1", 3)]
    assert [cards[0]["writes"] for cards in views] == ["yes", "yes", "yes"]
    assert views[1][0]["link"] == "down" and views[1][0]["first"]["active"] is False


def test_a_master_confirming_alone_says_so_in_the_link_and_the_writes() -> None:
    rows = [
        node("m1", pair="s1", alone_since=42),
        node("s1", "slave", pair="m1", pair_id="m1", state="dead", active=False, lag=LAG),
    ]
    (card,) = pairs(rows)
    assert (card["link"], card["link_class"], card["writes"]) == ("alone", "alone", "alone")
    assert card["active"] == "m1"
    assert card["writes_note"] == "m1 confirms writes alone since LSN 42: s1 is gone"
    assert card["first"]["alone"] is True and card["second"]["alone"] is False
    assert card["lag"] is None  # a stale lag is not shown on a link that is not up
    # The same pair seen by the master itself: its own replication says alone.
    mine = local("m1", partner="s1", link="alone", replication="alone", alone_since=42)
    (card,) = pairs(rows, mine)
    assert (card["local"], card["link"], card["writes"]) == (True, "alone", "alone")


def test_the_serving_nodes_own_pair_shows_a_refused_link_with_its_reason() -> None:
    # A slave whose key the master refuses: the two never paired, so gossip shows them apart.
    rows = [node("m1"), node("s1", "slave", active=False)]
    mine = local("s1", "follower", link="refused (wrong key)")
    cards = pairs(rows, mine)
    assert [(c["id"], c["local"]) for c in cards] == [("s1", True), ("m1", False)]  # this node's pair first
    s1 = cards[0]
    assert (s1["link"], s1["link_class"], s1["writes"]) == ("refused (wrong key)", "refused", "no")
    assert s1["writes_note"] == "s1 is a slave not paired with a master"
    assert pairs(rows)[1]["link"] == "down"  # seen from elsewhere, gossip knows no reason
    # A paired slave refused later (its master paired anew): the pair's master still takes writes.
    rows = [node("m1", pair="s1"), node("s1", "slave", pair="m1", pair_id="m1", active=False, lag=LAG)]
    mine = local("s1", "follower", partner="m1", link="refused (stranger)", in_sync=False)
    (card,) = pairs(rows, mine)
    assert (card["link"], card["link_class"], card["writes"], card["in_sync"]) == (
        "refused (stranger)", "refused", "yes", False,
    )  # fmt: skip
    assert card["lag"] is None


def test_the_serving_master_says_what_a_write_waits_for_or_why_it_takes_none() -> None:
    rows = [node("m1", pair="s1"), node("s1", "slave", pair="m1", pair_id="m1", active=False)]
    synced = local("m1", partner="s1", link="up", replication="sync", lag=LAG)
    (card,) = pairs(rows, synced)
    assert (card["link"], card["writes"], card["writes_note"], card["lag"]) == (
        "up", "yes", "sync: each write waits for s1", LAG,
    )  # fmt: skip
    fenced_rows = [{**rows[0], "active": False}, {**rows[1], "state": "dead"}]
    fenced = local("m1", "fenced", partner="s1", link="down")
    (card,) = pairs(fenced_rows, fenced)
    assert (card["active"], card["link"], card["writes"]) == (None, "down", "no")
    assert card["writes_note"].startswith("m1 is fenced")
    (card,) = pairs([node("m1")], local("m1", link="down", replication="unpaired"))
    assert (card["link"], card["writes"]) == ("unpaired", "yes")


def test_rows_without_pair_id_and_strays_of_an_old_pairing() -> None:
    rows = [node("m1", pair="s1"), node("s1", "slave", pair="m1", active=False), node("a", pair="b"),
            node("b", pair="a")]  # fmt: skip
    old = [{k: v for k, v in row.items() if k != "pair_id"} for row in rows]
    assert [(c["id"], sides(c)) for c in pairs(old)] == [
        ("a", ("a", None)), ("b", ("b", None)), ("m1", ("m1", "s1")),
    ]  # fmt: skip
    # m1 paired anew with s2; s1, dead, still announces the old pairing.
    rows = [
        node("m1", pair="s2"),
        node("s1", "slave", pair="m1", pair_id="m1", state="dead", active=False),
        node("s2", "slave", pair="m1", pair_id="m1", active=False, lag=LAG),
    ]
    assert [(c["id"], sides(c)) for c in pairs(rows)] == [("m1", ("m1", "s2")), ("s1", ("s1", None))]


def test_link_class() -> None:
    assert [link_class(x) for x in ("up", "refused (paired)", "alone", "connecting", "")] == [
        "up", "refused", "alone", "connecting", "down",
    ]  # fmt: skip
