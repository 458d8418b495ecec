"""The console's locks, over plain HTTP against a real in-process node: every route needs the
session (pages redirect to the login, JSON answers 401), every state-changing form needs the
session's CSRF token, payloads are escaped, the key is in no response, logins are throttled
and sessions end when idle."""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.config import Config, load_config
from kapok.console.session import SESSIONS
from kapok.node.app import make_app
from kapok.server.guard.listener import tls_context
from kapok.server.keys import CLIENTS
from kapok.testing.clock import ManualClock
from kapok.testing.console import ConsoleClient as Browser
from kapok.testing.console import cookie_jar
from kapok.testing.inprocess import InProcessNode
from kapok.testing.slow import scaled

KEY = "console-secret-7c41d2"
XSS = "<script>alert('kapok')</script>"


def config(tmp_path: Path, *sets: str) -> Config:
    sets = (f"storage.dir={tmp_path / 'data'}", f"mq.secret_key={KEY}", *sets)
    return load_config(None, overrides=list(sets), env={})


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time())


@pytest.fixture
async def node(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path, clock: ManualClock
) -> InProcessNode:
    app = make_app(config(tmp_path, "console.session_idle_s=600"), clock=clock)
    return InProcessNode(await aiohttp_server(app, host="127.0.0.1", port=0), app)


@pytest.fixture
async def anonymous() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as session:
        yield session


@pytest.fixture
async def browser(node: InProcessNode) -> AsyncIterator[Browser]:
    async with aiohttp.ClientSession(cookie_jar=cookie_jar()) as session:
        b = Browser(session, node.url)
        resp = await b.log_in(KEY)
        assert resp.status == 303 and resp.headers["Location"] == "/console/overview"
        yield b


async def publish(node: InProcessNode, topic: str, data: str, **fields: Any) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{node.url}/v1/topics/{topic}/messages",
            json={"data": data, **fields},
            headers={"Authorization": f"Bearer {KEY}"},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        (code,) = (await resp.json())["codes"]
        return str(code)


def console_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, path) of every console route but the login page and static files, with a
    made-up code in place of ``{code}``."""
    found = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "HEAD" or not (path == "/" or path.startswith("/console")):
            continue
        if path == "/console/login" or path.startswith("/console/static"):
            continue
        found.append((route.method, path.replace("{code}", "0" * 32)))
    return found


async def test_every_console_route_needs_the_session(
    node: InProcessNode, anonymous: aiohttp.ClientSession
) -> None:
    routes = console_routes(node.app)
    assert len(routes) >= 20, routes  # pages, actions and JSON: a new route is covered as it comes
    for method, path in routes:
        async with anonymous.request(method, node.url + path, allow_redirects=False) as resp:
            if path.startswith("/console/api/") or method == "POST":
                assert resp.status == 401, (method, path, resp.status)
                assert (await resp.json())["error"] == "unauthorized"
            else:
                assert resp.status == 302, (method, path, resp.status)
                assert resp.headers["Location"].startswith("/console/login?next=")
    # A forged or stale cookie is no session either.
    anonymous.cookie_jar.update_cookies({node.app[SESSIONS].cookie: "forged"})
    async with anonymous.get(node.url + "/console/api/overview") as resp:
        assert resp.status == 401


async def test_state_changing_requests_need_the_csrf_token(node: InProcessNode, browser: Browser) -> None:
    code = await publish(node, "orders", "keep me")
    for form in ({}, {"csrf": "wrong"}, {"csrf": browser.csrf + "x"}):
        status, body = await browser.post(f"/console/messages/{code}/delete", **form)
        assert status == 403 and '"error":"csrf_failed"' in body
        status, _ = await browser.post("/console/logout", **form)
        assert status == 403
    assert code in node.broker.messages
    status, _ = await browser.get("/console/overview")
    assert status == 200  # the refused logout did not end the session
    status, _ = await browser.post(f"/console/messages/{code}/delete", csrf=browser.csrf)
    assert status == 303 and code not in node.broker.messages


async def test_a_script_payload_is_shown_escaped(node: InProcessNode, browser: Browser) -> None:
    code = await publish(node, "<i>xss", XSS, key="<b>k")
    for path in (f"/console/messages/{code}", "/console/messages?topic=%3Ci%3Exss", "/console/topics",
                 "/console/analytics"):  # fmt: skip
        status, body = await browser.get(path)
        assert status == 200, path
        assert "<script>alert" not in body and "<i>xss" not in body and "<b>k" not in body, path
    _, body = await browser.get(f"/console/messages/{code}")
    assert "&lt;script&gt;alert(&#39;kapok&#39;)&lt;/script&gt;" in body
    assert "&lt;i&gt;xss" in body and "&lt;b&gt;k" in body
    status, body = await browser.get(f"/console/api/messages/{code}")
    assert status == 200 and XSS in body  # JSON carries the text; the page script sets it as text
    status, body = await browser.get("/console/messages?topic=%3Cscript%3E&code=zz")
    assert status == 400 and "code must be hexadecimal" in body and "<script>" not in body


async def test_the_key_is_in_no_response(
    node: InProcessNode, browser: Browser, anonymous: aiohttp.ClientSession
) -> None:
    code = await publish(node, "orders", "payload")
    for method, path in console_routes(node.app):
        if method != "GET":
            continue
        status, body = await browser.get(path.replace("0" * 32, code))
        assert status in (200, 302), (path, status)
        assert KEY not in body, path
    _, body = await browser.get("/console/overview")
    assert re.search(r"mq\.secret_key</td><td[^>]*>\(hidden\)", body)
    assert "cluster.secret" in body
    # Nor in what an anonymous caller can get: the login page, a failed login, errors.
    async with anonymous.get(node.url + "/console/login") as resp:
        assert KEY not in await resp.text()
    failed = Browser(anonymous, node.url)
    resp = await failed.log_in("wrong")
    assert resp.status == 401 and KEY not in await resp.text()


async def test_pages_carry_a_strict_content_policy(node: InProcessNode, browser: Browser) -> None:
    async with browser.http.get(node.url + "/console/overview") as resp:
        csp = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert resp.headers["Cache-Control"] == "no-store"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_login_cookie_and_redirects(node: InProcessNode, anonymous: aiohttp.ClientSession) -> None:
    b = Browser(anonymous, node.url)
    resp = await b.log_in(KEY, next_path="//evil.example/console/x")
    assert resp.status == 303 and resp.headers["Location"] == "/console/overview"
    cookie = next(c for c in resp.headers.getall("Set-Cookie") if c.startswith("kapok_console_"))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    async with anonymous.get(node.url + "/console/login?next=/console/clients", allow_redirects=False) as r:
        assert r.status == 302 and r.headers["Location"] == "/console/clients"  # logged in: goes on
    anonymous.cookie_jar.clear()
    resp = await b.log_in(KEY, next_path="/console/topics")
    assert resp.headers["Location"] == "/console/topics"
    # A login post without the form's own token (another site's form) is refused.
    async with anonymous.post(node.url + "/console/login", data={"key": KEY, "login_token": "x"}) as r:
        assert r.status == 403


async def test_wrong_keys_are_throttled_per_address(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path, anonymous: aiohttp.ClientSession
) -> None:
    app = make_app(config(tmp_path, "server.auth_backoff_s=30"))
    node = InProcessNode(await aiohttp_server(app, host="127.0.0.1", port=0), app)
    b = Browser(anonymous, node.url)
    for i in range(10):
        assert (await b.log_in(f"guess{i}")).status == 401  # the free ones, at once
    assert (await b.log_in("guess9")).status == 401  # a known wrong key again: no new guess
    assert (await b.log_in(KEY)).status == 303  # the right key is not kept out by them
    anonymous.cookie_jar.clear()
    # Four new wrong keys hold the address's slots: their 401s come after 30, 60, 120, 240 s.
    guessers = [aiohttp.ClientSession(cookie_jar=cookie_jar()) for _ in range(4)]
    late = [asyncio.create_task(Browser(g, node.url).log_in(f"late{i}")) for i, g in enumerate(guessers)]
    throttle = node.app[CLIENTS].auth_throttle
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(10)
    while throttle.pending("127.0.0.1", loop.time()) < 4:
        assert loop.time() < deadline and not any(task.done() for task in late)
        await asyncio.sleep(0.01)
    # Now no new key from the address is even compared, not even the right one (were it,
    # every quick 429 would tell a guesser "wrong"): the login page says to wait.
    assert (await b.log_in("one more")).status == 429
    assert (await b.log_in(KEY)).status == 429
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for g in guessers:
        await g.close()
    assert node.app[CLIENTS].auth_failures == 10 + 1 + 4


async def test_a_session_ends_when_idle(node: InProcessNode, browser: Browser, clock: ManualClock) -> None:
    assert (await browser.get("/console/api/overview"))[0] == 200
    clock.advance(599)
    assert (await browser.get("/console/api/overview"))[0] == 200  # use keeps it alive
    clock.advance(601)
    assert (await browser.get("/console/api/overview"))[0] == 401
    status, _ = await browser.get("/console/topics")
    assert status == 302


async def test_logout_ends_the_session(node: InProcessNode, browser: Browser) -> None:
    status, _ = await browser.post("/console/logout", csrf=browser.csrf)
    assert status == 303
    assert (await browser.get("/console/api/overview"))[0] == 401


async def test_a_disabled_console_serves_nothing(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path, anonymous: aiohttp.ClientSession
) -> None:
    app = make_app(config(tmp_path, "console.enabled=false"))
    node = InProcessNode(await aiohttp_server(app, host="127.0.0.1", port=0), app)
    assert console_routes(app) == []
    for path in ("/", "/console/login", "/console/overview", "/console/static/console.css"):
        async with anonymous.get(node.url + path, allow_redirects=False) as resp:
            assert resp.status == 404, path
    async with anonymous.get(node.url + "/health") as resp:
        assert resp.status == 200


def set_cookies(resp: aiohttp.ClientResponse) -> list[str]:
    return list(resp.headers.getall("Set-Cookie", []))


async def test_every_console_cookie_is_secure_under_tls_and_only_then(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    key, chain = tmp_path / "key.pem", tmp_path / "cert.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    tls_sets = (f"server.tls_cert={chain}", f"server.tls_key={key}")

    async def cookies_of_a_visit(sets: tuple[str, ...], https: bool, log_in: bool) -> list[str]:
        """Every Set-Cookie of the login page, a login and a logout (``log_in``)."""
        cfg = config(tmp_path / f"{len(sets)}{https}", *sets)
        app = make_app(cfg)
        server = await aiohttp_server(app, host="127.0.0.1", port=0, ssl=tls_context(cfg) if https else None)
        url = f"{'https' if https else 'http'}://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession(
            cookie_jar=cookie_jar(), connector=aiohttp.TCPConnector(ssl=client_tls)
        ) as s:
            async with s.get(url + "/console/login") as resp:
                seen = set_cookies(resp)
            if log_in:
                b = Browser(s, url)
                resp = await b.log_in(KEY)
                assert resp.status == 303, await resp.text()
                seen += set_cookies(resp)
                async with s.post(url + "/console/logout", data={"csrf": b.csrf}, allow_redirects=False) as r:
                    assert r.status == 303
                    seen += set_cookies(r)
        return seen

    # Over https: the login form's cookie, the session's, and their deletions.
    over_tls = await cookies_of_a_visit(tls_sets, https=True, log_in=True)
    # server.tls_cert set, a request over plain HTTP all the same (a forwarded port, say): the
    # login form's cookie is Secure, so no browser would send it back over plain HTTP.
    configured = await cookies_of_a_visit(tls_sets, https=False, log_in=False)
    plain = await cookies_of_a_visit((), https=False, log_in=True)
    assert len(over_tls) == 4 and len(configured) == 1 and len(plain) == 4, (over_tls, configured, plain)
    for cookie in over_tls + configured + plain:
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    assert all("; Secure" in cookie for cookie in over_tls + configured), over_tls + configured
    assert not any("Secure" in cookie for cookie in plain), plain
