"""The console in real headless Chromium: Playwright for Python driving the system's Chromium.

Nothing downloads a browser: the executable is Debian's ``chromium`` (``build/test.sh``
installs it when missing). One browser serves every browser test; each test gets a fresh
context (no shared cookies), logs in through the form, and leaves a screenshot of where it
ended in ``.test-output/browser/<test>.png``. The node is a real ``kapok serve`` process
(gossip on, so the Cluster page has a view to show), shared by the tests of a module.
Playwright's time-outs (5 s for an ``expect``, 30 s for an action or a page load) are
bounds like the tests' others: scaled by ``KAPOK_TEST_SLOW`` (``kapok.testing.slow``).
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Playwright, ViewportSize, expect, sync_playwright

from kapok.launch import NodeProcess, cluster_sets, start_node
from kapok.testing.slow import scaled

KEY = "console-key-5b1f9e"  # distinctive, so a test can look for it in every response
OUTPUT = Path(__file__).resolve().parents[2] / ".test-output" / "browser"
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium on PATH: `bash build/test.sh` installs Debian's (apt-get install chromium)")


# Package scope (tests/browser has an __init__.py for it), not session: while Playwright's
# sync API is alive it marks its event loop as running in this thread, which would break
# the async tests of the other folders that run after these.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    expect.set_options(timeout=scaled(5_000))  # ms
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
    yield browser
    browser.close()


class Console:
    """The node under test, and what tests do with it."""

    key = KEY
    desktop = DESKTOP
    phone = PHONE

    def __init__(self, node: NodeProcess) -> None:
        self.node = node
        self.url = node.url

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the node's v1 HTTP API with the key."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=scaled(10)) as response:
            return json.loads(response.read())

    def log_in(self, page: Page, key: str = KEY) -> None:
        page.goto(self.url + "/console/overview")
        page.wait_for_url("**/console/login**")
        page.fill("#key", key)
        page.click("button[type=submit]")

    @staticmethod
    def screenshot(page: Page, name: str) -> Path:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    base = tmp_path_factory.mktemp("console-node")
    proc = start_node(
        base / "node0",
        *cluster_sets("fast"),
        f"mq.secret_key={KEY}",
        "mq.max_deliveries=1",
        f"storage.dir={base / 'data0'}",
        "storage.fsync=never",
        "console.refresh_s=2",
    )
    try:
        yield Console(proc)
    finally:
        proc.stop()


@pytest.fixture
def page(browser: Browser, console: Console, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A logged-in page on the node's console; screenshot saved when the test ends."""
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(scaled(30_000))  # ms, actions and page loads
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    console.log_in(page)
    page.wait_for_url("**/console/overview")
    yield page
    console.screenshot(page, request.node.name)
    context.close()
    assert not errors, f"the page reported errors: {errors}"  # CSP violations and script errors land here
