"""The Cluster page follows gossip and replication, live (no reload of the page):

* pair cards keep their name through a takeover, show the link (up, alone, refused) and
  whether the pair takes writes, and never show a dead node active;
* a second real node appears alive, and turns dead once it is killed (SIGKILL);
* a real slave following this module's node is drawn beside it.

The pair-card tests come first: their nodes end dead or gone, and a dead member still
counts in every view's majority for a while (``forget_dead_s``); the later tests count
members relative to what they find.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from kapok.launch import NodeProcess, cluster_sets, start_node, stop_all
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

# ms: the fast profile declares a killed node dead in a few seconds; room for a slow box
GOSSIP_S = scaled(30_000)
FAILOVER_S = 1.0  # replication.failover_timeout_s of the pairs started here


def start_pair(console: Any, base: Path, name: str, *sets: str) -> list[NodeProcess]:
    """``<name>-m`` and its slave ``<name>-s`` (sync mode), in the console node's cluster."""
    gossip = cluster_sets("fast", [console.node.gossip_addr])
    common = ("replication.mode=sync", f"replication.failover_timeout_s={FAILOVER_S}", "storage.fsync=never")
    key = f"mq.secret_key={console.key}"
    master = start_node(base / f"{name}-m", *gossip, *common, f"server.name={name}-m", key)
    try:
        slave = start_node(
            base / f"{name}-s", *gossip, *common, f"server.name={name}-s", "replication.role=slave",
            f"replication.master={master.url}", *(sets or (key,)),
        )  # fmt: skip
    except BaseException:
        master.stop()
        raise
    return [master, slave]


def pair_card(page: Page, pair_id: str) -> Locator:
    name = page.locator("h3 [data-k=id]", has_text=re.compile(f"^{re.escape(pair_id)}$"))
    return page.locator(".pair", has=name)


def sides(card: Locator) -> Locator:
    return card.locator(".member:not(.placeholder)")


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    stop_all(started)


def test_pair_cards_show_the_link_going_alone_and_a_takeover_under_the_same_name(
    page: Page, console: Any, tmp_path: Path, nodes: list[NodeProcess]
) -> None:
    """Two sync pairs join this node's cluster. Pair ``a`` loses its slave (SIGKILL): its
    master goes on alone, and the card says so. Pair ``b`` loses its master: the slave
    takes over at epoch 2 in the same card, and the dead master is not shown active."""
    page.click("nav >> text=Cluster")
    page.evaluate("window.__sameDocument = true")
    nodes += start_pair(console, tmp_path, "a")
    nodes += start_pair(console, tmp_path, "b")
    a_slave, b_master = nodes[1], nodes[2]
    a, b = pair_card(page, "a-m"), pair_card(page, "b-m")
    for card, name in ((a, "a"), (b, "b")):
        expect(card.locator(".link-state")).to_have_text("up", timeout=GOSSIP_S)
        expect(card.locator(".badge.writes")).to_have_text("yes")
        expect(sides(card).locator("[data-k$='.name']")).to_have_text([f"{name}-m", f"{name}-s"])
        expect(sides(card).first.locator(".badge.is-active")).to_be_visible()
        expect(sides(card).nth(1).locator(".badge.is-active")).to_be_hidden()
    expect(a.locator(".link")).to_contain_text("records")  # the lag of a link that is up
    console.screenshot(page, "cluster_pairs_up")

    a_slave.kill()
    b_master.kill()
    expect(a.locator(".link-state")).to_have_text("alone", timeout=GOSSIP_S)
    expect(a.locator(".link-state")).to_have_class(re.compile(r"\bis-alone\b"))
    expect(a.locator(".badge.writes")).to_have_text("alone")
    expect(a.locator(".pair-facts .note")).to_contain_text("a-m confirms writes alone since LSN")
    expect(a.locator(".pair-facts .note")).to_contain_text("a-s is gone")
    expect(sides(a).first.locator("dt", has_text="Alone since")).to_be_visible()
    expect(sides(a).nth(1).locator(".badge[data-k$='.state']")).to_have_text("dead")
    expect(sides(a).nth(1).locator(".active-flag")).to_have_text("no")

    # Pair b: same card, same places; the slave leads at epoch 2, alone too (its master is gone).
    expect(b.locator(".pair-facts [data-k=active]")).to_have_text("b-s", timeout=GOSSIP_S)
    expect(b.locator(".pair-facts [data-k=epoch]")).to_have_text("2")
    expect(sides(b).locator("[data-k$='.name']")).to_have_text(["b-m", "b-s"])
    expect(sides(b).first.locator(".badge[data-k$='.state']")).to_have_text("dead")
    expect(sides(b).first.locator(".active-flag")).to_have_text("no")
    expect(sides(b).first.locator(".badge.is-active")).to_be_hidden()
    expect(sides(b).nth(1).locator(".badge.is-active")).to_be_visible()
    expect(sides(b).nth(1).locator(".badge[data-k$='.role']")).to_have_text("master")
    expect(b.locator(".badge.writes")).to_have_text(re.compile("^(yes|alone)$"))
    members = page.locator("#members tbody tr", has=page.locator("td a", has_text=re.compile("^b-m$")))
    expect(members.locator("td[data-label=Active]")).to_have_text("no")  # dead: never active
    page.screenshot(path=str(tmp_path / "cluster-1280.png"), full_page=True)
    console.screenshot(page, "cluster_pairs_alone_and_taken_over")
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def test_a_slave_refused_by_its_master_says_why_on_its_own_console(
    browser: Browser, console: Any, tmp_path: Path, nodes: list[NodeProcess]
) -> None:
    """A slave with the wrong key: its own console (the serving node knows its link
    first-hand) shows the pair's link as ``refused (wrong key)`` and no writes."""
    wrong = "another-key-31c7"
    nodes += start_pair(console, tmp_path, "r", f"mq.secret_key={wrong}")
    slave = type(console)(nodes[1])  # the conftest's Console, on the slave
    context = browser.new_context(viewport=console.desktop)
    context.set_default_timeout(scaled(30_000))  # ms, as the conftest's page fixture
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        slave.log_in(page, wrong)
        page.wait_for_url("**/console/overview")
        expect(page.locator(".page-head .badge[data-k='node.replication']")).to_have_text("none")
        page.click("nav >> text=Cluster")
        card = pair_card(page, "r-s")
        expect(card.locator(".badge", has_text="this node's pair")).to_be_visible()
        expect(card.locator(".link-state")).to_have_text("refused (wrong key)", timeout=GOSSIP_S)
        expect(card.locator(".link-state")).to_have_class(re.compile(r"\bis-refused\b"))
        expect(card.locator(".badge.writes")).to_have_text("no")
        expect(pair_card(page, "r-m").locator(".badge.writes")).to_have_text("yes", timeout=GOSSIP_S)
        slave.screenshot(page, "cluster_refused_wrong_key")
    finally:
        context.close()
    assert not errors, f"the page reported errors: {errors}"


def test_second_node_appears_and_turns_dead(page: Page, console: Any, tmp_path: Path) -> None:
    page.click("nav >> text=Cluster")
    # Members of earlier tests may linger (dead, left): count from what is there.
    expect(page.locator("#members tbody tr").first).to_be_visible()
    members, cards = page.locator("#members tbody tr").count(), page.locator(".pair").count()
    alive = int(page.locator("#states dd").first.inner_text())
    page.evaluate("window.__sameDocument = true")
    second = start_node(
        tmp_path / "node1",
        *cluster_sets("fast", [console.node.gossip_addr]),
        f"mq.secret_key={console.key}",
        f"storage.dir={tmp_path / 'data1'}",
    )
    try:
        name = second.url.removeprefix("http://")
        link = page.locator("td a", has_text=re.compile(f"^{re.escape(name)}$"))
        row = page.locator("#members tbody tr", has=link)
        expect(row.locator(".badge[data-k=state]")).to_have_text("alive", timeout=GOSSIP_S)
        expect(row.locator("td a").first).to_have_attribute("href", f"{second.url}/console/cluster")
        expect(page.locator("#members tbody tr")).to_have_count(members + 1)
        expect(page.locator("#states dd").first).to_have_text(str(alive + 1))
        expect(page.locator(".pair")).to_have_count(cards + 1)  # a master of its own, not paired
        console.screenshot(page, "cluster_two_alive")
        second.kill()
        expect(row.locator(".badge[data-k=state]")).to_have_text("dead", timeout=GOSSIP_S)
        expect(row.locator(".badge[data-k=state]")).to_have_class(re.compile(r"\bis-dead\b"))
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    finally:
        second.stop()


def test_a_real_pair_shows_side_by_side_with_its_epoch_and_lag(
    page: Page, console: Any, tmp_path: Path
) -> None:
    """A real slave follows this module's node: the Cluster page draws the pair, its epoch
    and the slave's lag, live. (Last in the module: it pairs the node, then unpairs it.)"""
    page.click("nav >> text=Cluster")
    master = console.node
    slave = start_node(
        tmp_path / "slave",
        *cluster_sets("fast", [master.gossip_addr]),
        f"mq.secret_key={console.key}",
        "server.name=slave-1",
        "replication.role=slave",
        f"replication.master={master.url}",
    )
    try:
        pair = page.locator(".pair", has=page.locator(".name", has_text="slave-1"))
        expect(pair).to_have_count(1, timeout=GOSSIP_S)
        expect(pair.locator(".badge", has_text="this node's pair")).to_be_visible()
        expect(pair.locator(".link-state")).to_have_text("up", timeout=GOSSIP_S)
        expect(pair.locator(".pair-facts [data-k=epoch]")).to_have_text("1")
        expect(pair.locator(".pair-facts .note")).to_have_text("sync: each write waits for slave-1")
        expect(pair.locator(".link")).to_contain_text("records", timeout=GOSSIP_S)
        rows = page.locator("#members tbody tr", has=page.locator("td a", has_text="slave-1"))
        expect(rows.locator(".badge[data-k=state]")).to_have_text("alive")
        expect(rows.locator("td[data-label='Replication lag']")).to_contain_text("records", timeout=GOSSIP_S)
        console.screenshot(page, "cluster_pair_live")
    finally:
        slave.stop()
        console.api("POST", "/replication/unpair")
