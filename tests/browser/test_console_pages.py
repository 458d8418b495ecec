"""The console's pages in Chromium: login, live counts, message search, requeue from a DLQ,
and the layout at a phone's width."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from kapok.testing.slow import scaled

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

LIVE_S = scaled(15_000)  # ms: a refresh comes every 2 s (console.refresh_s); generous for a slow box


def test_login_keeps_the_key_out_of_the_browser(browser: Browser, console: Any) -> None:
    context = browser.new_context(viewport=console.desktop)
    context.set_default_timeout(scaled(30_000))  # ms, as the conftest's page fixture
    page = context.new_page()
    try:
        console.log_in(page, key="not-the-key")
        expect(page.locator(".error")).to_have_text("Wrong secret key.")
        page.fill("#key", console.key)
        page.click("button[type=submit]")
        page.wait_for_url("**/console/overview")
        expect(page.locator("h1")).to_have_text("Overview")
        cookies = context.cookies()
        session = [c for c in cookies if c["name"].startswith("kapok_console_")]
        assert len(session) == 1
        assert session[0]["httpOnly"] and session[0]["sameSite"] == "Strict"
        assert all(console.key not in c["value"] for c in cookies)
        storage = "JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])"
        stored = page.evaluate(storage)
        assert console.key not in stored
        assert console.key not in page.content()
        assert page.evaluate("document.cookie") == ""  # HttpOnly: invisible to scripts
        page.click("text=Log out")
        page.wait_for_url("**/console/login**")
        expect(page.locator(".notice")).to_have_text("You are logged out.")
        page.goto(console.url + "/console/topics")
        page.wait_for_url("**/console/login?next=/console/topics")
        console.screenshot(page, "test_login_keeps_the_key_out_of_the_browser")
    finally:
        context.close()


def test_counts_change_after_publishing_without_a_reload(page: Page, console: Any) -> None:
    live = page.locator("#counts dd").first
    expect(live).to_have_text(re.compile(r"^\d[\d,]*$"))
    before = int(live.inner_text().replace(",", ""))
    page.evaluate("window.__sameDocument = true")
    console.api("POST", "/v1/topics/counted/messages", {"messages": [{"data": f"m{i}"} for i in range(3)]})
    expect(live).to_have_text(f"{before + 3:,}", timeout=LIVE_S)
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    expect(page.locator("#live-status")).to_contain_text("updated")
    # The rates chart is a real SVG chart with its unit on the axis.
    expect(page.locator("#rates-chart svg polyline")).to_have_count(3)
    expect(page.locator("#rates-chart svg .unit").first).to_have_text("messages/s")


def test_search_a_message_and_open_it(page: Page, console: Any) -> None:
    payload = '{"order": 42, "note": "<b>find me</b>"}'
    published = console.api("POST", "/v1/topics/searched/messages", {"data": payload, "key": "eu.paris"})
    (code,) = published["codes"]
    console.api("POST", "/v1/topics/searched/messages", {"data": "another"})
    page.click("nav >> text=Messages")
    page.fill("input[name=topic]", "searched")
    page.fill("input[name=code]", code[:26])
    page.click("#search button[type=submit]")
    expect(page.locator("#total")).to_have_text("1")
    page.click(f"#results a:has-text('{code}')")
    page.wait_for_url(f"**/console/messages/{code}")
    expect(page.locator("#code")).to_have_text(code)
    # Pretty-printed JSON, shown as text: the <b> is not markup.
    expect(page.locator("#payload")).to_contain_text('"note": "<b>find me</b>"')
    assert page.locator("#payload b").count() == 0
    expect(page.locator("#entries")).to_contain_text("ready")


def test_requeue_a_dead_letter(page: Page, console: Any) -> None:
    (code,) = console.api("POST", "/v1/topics/jobs/messages", {"data": "failing job"})["codes"]
    leased = console.api("GET", "/v1/topics/jobs/messages?max=1")["messages"]
    assert [m["code"] for m in leased] == [code]
    console.api("POST", "/v1/topics/jobs/nack", {"codes": [code], "requeue": False})  # dead-letters it
    page.click("nav >> text=Topics")
    title = page.locator("h2 span[data-k=name]", has_text=re.compile("^jobs$"))
    card = page.locator("section.topic", has=title)
    expect(card.locator("a[data-k=dead_letters]")).to_have_text("1", timeout=LIVE_S)
    card.locator("a[data-k=dead_letters]").click()
    page.wait_for_url("**/console/messages?topic=jobs.dlq")
    row = page.locator("#results tbody tr")
    expect(row).to_have_count(1)
    dead_code = row.locator("td.mono").inner_text()
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button:has-text('Requeue')").click()
    page.wait_for_url(re.compile(r"/console/messages/[0-9a-f]{32}\?notice=requeued$"))
    expect(page.locator(".notice")).to_contain_text("published again")
    new_code = page.locator("#code").inner_text()
    again = console.api("GET", f"/v1/messages/{new_code}")
    assert again["topic"] == "jobs" and again["data"] == "failing job"
    assert console.api("GET", f"/v1/messages/{dead_code}")["groups"]["default"]["status"] == "consumed"
    leased = console.api("GET", "/v1/topics/jobs/messages?max=5")["messages"]
    assert [m["code"] for m in leased] == [new_code]


@pytest.mark.parametrize("slug", ["overview", "cluster", "topics", "clients", "messages", "analytics"])
def test_pages_fit_a_phone(page: Page, console: Any, slug: str) -> None:
    page.set_viewport_size(console.phone)
    page.goto(f"{console.url}/console/{slug}")
    expect(page.locator("h1")).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{slug} is {overflow} px wider than the phone"
    console.screenshot(page, f"phone_{slug}")
    page.set_viewport_size(console.desktop)
    page.goto(f"{console.url}/console/{slug}")
    expect(page.locator("h1")).to_be_visible()
    console.screenshot(page, f"desktop_{slug}")
