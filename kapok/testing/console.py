"""A console user over plain HTTP: logs in through the form, keeps the cookie and the CSRF token."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

__all__ = ["ConsoleClient", "cookie_jar"]


def cookie_jar() -> aiohttp.CookieJar:
    """A cookie jar that keeps the cookies of IP hosts (127.0.0.1), as a browser does."""
    return aiohttp.CookieJar(unsafe=True)


def form_field(html: str, name: str) -> str:
    match = re.search(rf'name="{name}" value="([^"]*)"', html)
    if match is None:
        raise AssertionError(f"no {name!r} field in the page")
    return match.group(1)


class ConsoleClient:
    """``http`` must keep cookies of IP hosts (``cookie_jar()``)."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.csrf = ""

    async def log_in(self, key: str, next_path: str = "/console/overview") -> aiohttp.ClientResponse:
        """Post the login form; on success (303) the CSRF token is read from the overview page."""
        async with self.http.get(self.url + "/console/login") as resp:
            token = form_field(await resp.text(), "login_token")
        form = {"key": key, "login_token": token, "next": next_path}
        resp = await self.http.post(self.url + "/console/login", data=form, allow_redirects=False)
        if resp.status == 303:
            async with self.http.get(self.url + "/console/overview") as page:
                self.csrf = form_field(await page.text(), "csrf")
        return resp

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path, allow_redirects=False) as resp:
            return resp.status, await resp.text()

    async def json(self, path: str) -> Any:
        async with self.http.get(self.url + path, allow_redirects=False) as resp:
            if resp.status != 200:
                raise AssertionError(f"GET {path}: {resp.status} {await resp.text()}")
            return await resp.json()

    async def post(self, path: str, **form: str) -> tuple[int, str]:
        async with self.http.post(self.url + path, data=form, allow_redirects=False) as resp:
            return resp.status, await resp.text()
