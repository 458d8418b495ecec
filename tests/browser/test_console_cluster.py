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


def test_pairs_and_replication_lag_render_live(page: Page, console: Any) -> None:
    """Replication is not in this node yet: the live refresh is fed the rows it will report
    (pair, epoch, lag) and must draw the pair side by side with its lag."""
    page.click("nav >> text=Cluster")
    page.select_option("#refresh", "0")  # paused, so the node's own view does not come back
    master = {"name": "m1", "http_url": "http://10.0.0.1:8011", "state": "alive", "role": "master",
              "console_url": "http://10.0.0.1:8011/console/cluster", "active": True, "incarnation": 3,
              "load": 12.0}  # fmt: skip
    slave = {**master, "name": "s1", "http_url": "http://10.0.0.2:8011", "state": "suspect", "role": "slave",
             "console_url": "http://10.0.0.2:8011/console/cluster", "active": False, "load": 0.0}  # fmt: skip
    lag = {"records": 1200, "bytes": 5 * 1024**2, "seconds": 2.5}
    data = {
        "states": {"alive": 1, "suspect": 1, "dead": 0, "left": 0},
        "pairs": [{"master": master, "slave": slave, "epoch": 7, "lag": lag}],
        "members": [
            {**master, "pair": "s1", "epoch": 7, "lag": None, "self": True, "gossip_addr": "10.0.0.1:8021",
             "version": "0.2.0"},
            {**slave, "pair": "m1", "epoch": 7, "lag": lag, "self": False, "gossip_addr": "10.0.0.2:8021",
             "version": "0.2.0"},
        ],
    }  # fmt: skip
    page.evaluate("data => Kapok.fill(document.querySelector('main'), data)", data)
    pair = page.locator(".pair")
    expect(pair).to_have_count(1)
    expect(pair.locator(".member.is-alive .name")).to_have_text("m1")
    expect(pair.locator(".member.is-suspect .name")).to_have_text("s1")
    expect(pair.locator(".link")).to_contain_text("epoch 7")
    expect(pair.locator(".link")).to_contain_text("1,200 records · 5.0 MiB · 2.5 s")
    rows = page.locator("#members tbody tr")
    lags = rows.locator("td[data-label='Replication lag']")
    expect(lags.nth(1)).to_have_text("1,200 records · 5.0 MiB · 2.5 s", use_inner_text=True)
    expect(lags.nth(0)).to_have_text("—", use_inner_text=True)
    expect(rows.nth(1).locator("td a").first).to_have_attribute("href", "http://10.0.0.2:8011/console/cluster")
    console.screenshot(page, "cluster_pairs_with_lag")
