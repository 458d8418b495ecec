"""Discovery and its error paths over HTTP, with aioresponses standing in for the nodes."""

from __future__ import annotations

import aiohttp
import pytest
from aioresponses import aioresponses
from tests.unit.client.fakes import MockResponse

from kapok.client.discovery import Discovery, normalize_seeds
from kapok.errors import AuthError, NotActiveError, UnavailableError

ROWS = [
    {"name": "m1", "http_url": "http://10.0.0.1:8011", "state": "alive", "role": "master", "active": True},
    {"name": "m2", "http_url": "http://10.0.0.2:8011", "state": "alive", "role": "master", "active": True},
]


async def test_the_first_seed_that_answers_wins() -> None:
    with aioresponses() as mock:
        mock.get("http://down.test:1/cluster/nodes", exception=aiohttp.ClientConnectionError("refused"))
        mock.get("http://up.test:1/cluster/nodes", payload=ROWS, response_class=MockResponse)
        async with aiohttp.ClientSession() as http:
            discovery = Discovery(["http://down.test:1", "http://up.test:1/"], http)
            members = await discovery.refresh()
    assert [m.name for m in members] == ["m1", "m2"]


async def test_known_members_are_asked_before_the_seeds() -> None:
    with aioresponses() as mock:
        mock.get("http://seed.test:1/cluster/nodes", payload=ROWS, response_class=MockResponse)
        for host in ("10.0.0.1", "10.0.0.2"):
            mock.get(f"http://{host}:8011/cluster/nodes", payload=ROWS[:1], response_class=MockResponse)
        async with aiohttp.ClientSession() as http:
            discovery = Discovery("http://seed.test:1", http)
            assert len(await discovery.refresh()) == 2
            assert [m.name for m in await discovery.refresh()] == ["m1"]  # a member answered


async def test_a_node_that_is_not_active_is_passed_over_in_either_error_shape() -> None:
    nested = {"error": {"code": "not_active", "message": "slave of m1"}}
    flat = {"error": "not_active", "message": "slave of m1"}
    with aioresponses() as mock:
        mock.get("http://a.test:1/cluster/nodes", status=503, payload=nested, response_class=MockResponse)
        mock.get("http://b.test:1/cluster/nodes", status=503, payload=flat, response_class=MockResponse)
        mock.get("http://a.test:1/cluster/nodes", status=503, payload=nested, response_class=MockResponse)
        async with aiohttp.ClientSession() as http:
            discovery = Discovery(["http://a.test:1", "http://b.test:1"], http)
            with pytest.raises(UnavailableError, match="slave of m1") as info:
                await discovery.refresh()
            with pytest.raises(NotActiveError):
                await discovery._ask("http://a.test:1")
    assert "a.test" in str(info.value) and "b.test" in str(info.value)


async def test_kapokmq_mode_reads_the_registry_and_reports_a_wrong_key() -> None:
    registry = [{"Name": "mq:127.0.0.1:9001", "Addr": "127.0.0.1", "Port": "9001"}]
    with aioresponses() as mock:
        mock.post("http://a.test:1/Registry/GetNodes", payload=registry, response_class=MockResponse)
        wrong_key = {"code": -1, "msg": "Secret key matching error"}
        mock.post("http://a.test:1/Registry/GetNodes", payload=wrong_key, response_class=MockResponse)
        async with aiohttp.ClientSession() as http:
            discovery = Discovery("http://a.test:1", http, protocol="kapokmq", secret="s")
            assert [m.url for m in await discovery.refresh()] == ["http://127.0.0.1:9001"]
            discovery.members = []
            with pytest.raises(AuthError):
                await discovery.refresh()
        request = next(iter(mock.requests.values()))[0]
    assert request.kwargs["headers"] == {"secretKey": "s"}


def test_seeds_are_http_urls() -> None:
    assert normalize_seeds(["http://a:1/", "http://a:1"]) == ["http://a:1"]
    with pytest.raises(ValueError):
        normalize_seeds("a:1")
    with pytest.raises(ValueError):
        normalize_seeds([])
