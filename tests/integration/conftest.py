"""Fixtures of the integration layer: nodes served in the test's own event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from kapok.config import load_config
from kapok.testing.inprocess import RunningApp, run_app

Start = Callable[..., Awaitable[RunningApp]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """``await start(name, *sets)``: a node named ``name`` with its storage under ``tmp_path``
    (fsync never) and the ``--set`` items ``sets``; every node started is stopped at the end."""
    running: list[RunningApp] = []

    async def start_node(name: str, *sets: str) -> RunningApp:
        config = load_config(
            None,
            overrides=[f"server.name={name}", f"storage.dir={tmp_path / name}", "storage.fsync=never", *sets],
            env={},
        )
        node = await run_app(config)
        running.append(node)
        return node

    yield start_node
    for node in reversed(running):
        await node.stop()
