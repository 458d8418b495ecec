"""Small synchronous HTTP calls to a running node, for tests that drive real processes:
publish to a topic, drain it, read one metric. Blocking (urllib), so a test thread or a
plain test function can call them while the nodes run in other processes. Their time-outs
are bounds, scaled by ``KAPOK_TEST_SLOW`` (``kapok.testing.slow``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, overload

from kapok.testing.slow import scaled

if TYPE_CHECKING:
    import aiohttp

__all__ = ["drain", "metric", "publish", "scrape_metric"]


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def publish(
    url: str, *datas: str, topic: str = "jobs", key: str = "test", timeout_s: float = 10.0
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/topics/<topic>/messages``: the status and the JSON answer; ``(0, {})`` when
    the node did not answer at all."""
    body = json.dumps({"messages": [{"data": d} for d in datas]}).encode()
    request = urllib.request.Request(f"{url}/v1/topics/{topic}/messages", data=body, headers=_headers(key))
    try:
        with urllib.request.urlopen(request, timeout=scaled(timeout_s)) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def drain(
    url: str, *, topic: str = "jobs", group: str = "default", key: str = "test"
) -> list[dict[str, Any]]:
    """Lease and ack every ready message of ``topic`` for ``group``; the messages, in order.

    As a client does, a call the node refuses with 503 (it cannot take requests *now*: a
    leader that doubts its view after a stall it took for a freeze, for up to a failover
    timeout) is made again, within ``UNAVAILABLE_S``; nothing was leased or acked by it.
    Any other refusal fails with the node's answer."""
    out: list[dict[str, Any]] = []
    for _ in range(10_000):
        leased = _call(f"{url}/v1/topics/{topic}/messages?max=500&group={group}", None, key)
        batch: list[dict[str, Any]] = leased["messages"]
        if not batch:
            return out
        out += batch
        ack = json.dumps({"group": group, "codes": [m["code"] for m in batch]}).encode()
        _call(f"{url}/v1/topics/{topic}/ack", ack, key)
    raise AssertionError(f"{topic} on {url} never ran dry")


UNAVAILABLE_S = 30.0  # how long drain() makes a call again that the node refuses with 503


def _call(url: str, body: bytes | None, key: str) -> dict[str, Any]:
    deadline = time.monotonic() + scaled(UNAVAILABLE_S)
    while True:
        request = urllib.request.Request(url, data=body, headers=_headers(key))
        try:
            with urllib.request.urlopen(request, timeout=scaled(10.0)) as resp:
                answer: dict[str, Any] = json.loads(resp.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            why = exc.read().decode(errors="replace")
            if exc.code != 503 or time.monotonic() >= deadline:
                raise AssertionError(f"{request.get_method()} {url}: {exc.code} {why}") from None
        time.sleep(0.05)


def metric(url: str, name: str, default: float = 0.0) -> float:
    """One unlabelled sample of ``GET /metrics``; ``default`` when it is absent or the node
    does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=scaled(5.0)) as resp:
            found = _sample(resp.read().decode(), name)
    except OSError:
        return default
    return default if found is None else found


@overload
async def scrape_metric(session: aiohttp.ClientSession, url: str, name: str) -> float: ...


@overload
async def scrape_metric(
    session: aiohttp.ClientSession, url: str, name: str, default: None
) -> float | None: ...


async def scrape_metric(
    session: aiohttp.ClientSession, url: str, name: str, default: float | None = 0.0
) -> float | None:
    """``metric`` for a test on the node's own event loop (an in-process node must not be
    read with a blocking call): one unlabelled sample, ``default`` when it is absent."""
    async with session.get(url + "/metrics") as resp:
        found = _sample(await resp.text(), name)
    return default if found is None else found


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
