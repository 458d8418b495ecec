"""The Cluster page follows gossip: a second real node appears alive, and turns dead once
it is killed (SIGKILL), without a reload of the page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from kapok.launch import cluster_sets, start_node

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

GOSSIP_S = 30_000  # ms: the fast profile declares a killed node dead in a few seconds; room for a slow box


def test_second_node_appears_and_turns_dead(page: Page, console: Any, tmp_path: Path) -> None:
    page.click("nav >> text=Cluster")
    expect(page.locator("#members tbody tr")).to_have_count(1)
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
        expect(page.locator("#states dd").first).to_have_text("2")
        expect(page.locator(".pair")).to_have_count(2)  # two masters, neither paired yet
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
        expect(pair.locator(".link")).to_contain_text("epoch 1", timeout=GOSSIP_S)
        expect(pair.locator(".link")).to_contain_text("records", timeout=GOSSIP_S)
        rows = page.locator("#members tbody tr", has=page.locator("td a", has_text="slave-1"))
        expect(rows.locator(".badge[data-k=state]")).to_have_text("alive")
        expect(rows.locator("td[data-label='Replication lag']")).to_contain_text("records", timeout=GOSSIP_S)
        console.screenshot(page, "cluster_pair_live")
    finally:
        slave.stop()
        console.api("POST", "/replication/unpair")
