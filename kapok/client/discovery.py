"""Finding the cluster: ask a seed (or any member already known) for its view.

Native mode reads ``GET /cluster/nodes`` (no key needed); KapokMQ mode reads
``POST /Registry/GetNodes`` with the ``secretKey`` header, which every Kapok node answers
and which is what KapokMQ's own cluster producer asks its registry. Members already known
are asked first (in random order, so a fleet of clients does not hammer one node), the
seeds last; the first good answer is the view.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import aiohttp

from kapok.client.session import remote_error
from kapok.client.view import Member, live_pairs, members_from_nodes, members_from_registry
from kapok.errors import AuthError, ClusterUnavailableError, KapokError
from kapok.protocol.kapokmq import KEY_ERROR

__all__ = ["Discovery", "normalize_seeds"]


def normalize_seeds(seeds: Sequence[str] | str) -> list[str]:
    items = [seeds] if isinstance(seeds, str) else list(seeds)
    out = []
    for seed in items:
        url = seed.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a seed is a node's HTTP base URL such as http://127.0.0.1:8011, got {seed!r}")
        if url not in out:
            out.append(url)
    if not out:
        raise ValueError("at least one seed URL is needed")
    return out


def _http_error(status: int, body: Any) -> KapokError:
    """Today's ``{"error": code, "message": text}`` and the nested ``{"error": {"code", "message"}}``."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return remote_error(err.get("code"), err.get("message"))
        if isinstance(err, str):
            return remote_error(err, body.get("message"))
    return KapokError(f"HTTP {status}")


class Discovery:
    def __init__(
        self,
        seeds: Sequence[str] | str,
        http: aiohttp.ClientSession,
        *,
        protocol: str = "native",
        secret: str = "test",
        timeout_s: float = 5.0,
        rng: random.Random | None = None,
    ) -> None:
        self.seeds = normalize_seeds(seeds)
        self.http = http
        self.protocol = protocol
        self.secret = secret
        self.timeout_s = timeout_s
        self.members: list[Member] = []
        self.pairs: set[str] = set()  # pairs with a live member, active or not (native mode)
        self._rng = rng or random.Random()

    async def refresh(self) -> list[Member]:
        """The view of the first node that answers; ``ClusterUnavailableError`` if none does.
        A wrong key (KapokMQ mode) is an ``AuthError`` at once: asking others won't help."""
        known = [m.url for m in self.members]
        self._rng.shuffle(known)
        errors = []
        for url in dict.fromkeys([*known, *self.seeds]):
            try:
                self.members, self.pairs = await self._ask(url)
                return self.members
            except AuthError:
                raise
            except TimeoutError:
                errors.append(f"{url}: no answer within {self.timeout_s:g} s")
            except (aiohttp.ClientError, ValueError, KapokError) as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
        raise ClusterUnavailableError("no node answered with its cluster view: " + "; ".join(errors[:3]))

    async def _ask(self, url: str) -> tuple[list[Member], set[str]]:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        if self.protocol == "kapokmq":
            request = self.http.post(
                f"{url}/Registry/GetNodes", headers={"secretKey": self.secret}, timeout=timeout
            )
        else:
            request = self.http.get(f"{url}/cluster/nodes", timeout=timeout)
        async with request as response:
            body = await response.json(content_type=None)
            if response.status >= 400:
                raise _http_error(response.status, body)
        if self.protocol == "kapokmq":
            if isinstance(body, dict):  # {"code": -1, "msg": ...}
                msg = str(body.get("msg", body))
                raise AuthError(msg) if msg == KEY_ERROR else KapokError(msg)
            members = members_from_registry(body if isinstance(body, list) else [])
            return members, {m.pair for m in members}
        if not isinstance(body, list):
            raise ValueError("the answer is not a list of members (is this a Kapok node?)")
        return members_from_nodes(body), live_pairs(body)
