"""Shared fixtures: real nodes on 127.0.0.1 with port 0, configured per test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from kapok.clock import Clock
from kapok.config import Config, load_config
from kapok.node.app import make_app
from kapok.testing import ManualClock
from kapok.testing.inprocess import InProcessNode

# The session's last step: kill every process group kapok.launch started that is still running
# (a test that failed or timed out before stopping its nodes) and fail the run if there was any.
from kapok.testing.leakcheck import pytest_sessionfinish, pytest_testnodedown  # noqa: F401
from kapok.testing.slow import ENV, factor, scale_launch_deadlines, scaled

SECRET = "test"

NodeFactory = Callable[..., Awaitable["Node"]]


class Node(InProcessNode):
    """A running in-process node: its test server, service and base URLs."""


def pytest_configure(config: pytest.Config) -> None:
    try:
        factor()  # a malformed KAPOK_TEST_SLOW stops the run here, not in the first test that waits
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    scale_launch_deadlines()


def pytest_report_header(config: pytest.Config) -> str:
    return f"{ENV}={factor():g}: the tests' time bounds (and pytest-timeout's) are multiplied by it"


# pytest-timeout's limit per test (pyproject.toml's ``timeout``, --timeout or a test's
# ``timeout`` marker) is a bound like the others: scaled by KAPOK_TEST_SLOW. The plugin's
# own hook (trylast) sets the timer; this one runs first and hands it the scaled limit.
@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> object:
    if factor() == 1.0:
        return None
    import pytest_timeout  # type: ignore[import-untyped]

    scaled_settings = settings._replace(timeout=scaled(settings.timeout))
    return pytest_timeout.pytest_timeout_set_timer(item=item, settings=scaled_settings)


def make_config(*sets: str) -> Config:
    """Defaults plus ``--set``-style overrides; the environment is ignored."""
    return load_config(None, overrides=list(sets), env={})


@pytest.fixture
async def make_node(aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path) -> NodeFactory:
    """Start nodes; each keeps its data in its own folder under the test's tmp_path.

    ``clock=`` gives a node the clock its broker rules run on (ack deadlines, leases,
    delays, long-poll time-outs): a ``ManualClock`` lets a test move time itself.
    """
    count = 0

    async def factory(*sets: str, clock: Clock | None = None) -> Node:
        nonlocal count
        count += 1
        app = make_app(make_config(f"storage.dir={tmp_path / f'node{count}'}", *sets), clock=clock)
        server = await aiohttp_server(app, host="127.0.0.1", port=0)
        return Node(server, app)

    return factory


@pytest.fixture
async def node(make_node: NodeFactory) -> Node:
    return await make_node()


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test advances it; pass it to ``make_node(clock=...)``."""
    return ManualClock()


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRET}"}
