"""The blocking-call detector of this layer (``conftest.blocking_calls``) at work: a call
that stalls the event loop from kapok's code is caught, with its stack, and fails the
test it happened in; a test's own plain call into a kapok helper is not counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from tests.integration.conftest import OFF_SWITCH, BlockingCall, Start

from kapok.server.routes.middlewares import error_middleware
from kapok.service import BrokerService
from kapok.storage.segments import list_segments
from kapok.testing.slow import scaled

AUTH = {"Authorization": "Bearer test"}
detector_on = pytest.mark.skipif(os.environ.get(OFF_SWITCH) == "0", reason=f"{OFF_SWITCH}=0: no detector")


async def stalling(request: web.Request) -> web.Response:
    time.sleep(0.05)  # noqa: ASYNC251 (the bug the detector is for: the whole node waits)
    return web.json_response({"ok": True})


@detector_on
async def test_a_sleep_in_a_handler_behind_kapoks_middleware_is_caught(
    aiohttp_server: Any, blocking_calls: list[BlockingCall]
) -> None:
    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/stall", stalling)
    server: TestServer = await aiohttp_server(app, host="127.0.0.1", port=0)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{server.port}/stall") as resp,
    ):
        assert resp.status == 200  # the call is not interrupted: it is recorded
    (call,) = blocking_calls
    assert call.func == "time.sleep"
    assert "in error_middleware" in call.stack and "in stalling" in call.stack, call.stack
    blocking_calls.clear()  # made on purpose: this test passes


@detector_on
async def test_a_blocking_call_inside_a_node_is_caught(
    start: Start, monkeypatch: pytest.MonkeyPatch, blocking_calls: list[BlockingCall]
) -> None:
    node = await start("a")
    publish = BrokerService.publish

    def slow_publish(self: BrokerService, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return publish(self, *args, **kwargs)

    monkeypatch.setattr(BrokerService, "publish", slow_publish)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{node.url}/v1/topics/t/messages", json={"data": "x"}, headers=AUTH) as resp,
    ):
        assert resp.status == 200, await resp.text()
    assert [call.func for call in blocking_calls] == ["time.sleep"]
    assert "kapok/server/routes/v1_http.py" in blocking_calls[0].stack
    blocking_calls.clear()


async def test_a_tests_own_call_into_a_kapok_helper_is_not_counted(
    tmp_path: Path, blocking_calls: list[BlockingCall]
) -> None:
    (tmp_path / "wal-00000000000000000001.log").write_bytes(b"")
    assert len(list_segments(tmp_path)) == 1  # scandir, from the test's coroutine
    assert blocking_calls == []


def test_a_test_that_stalls_the_loop_fails(tmp_path: Path) -> None:
    """The whole way: a test file beside this layer's conftest, run by pytest, fails."""
    conftest = Path(__file__).with_name("conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_stall.py").write_text(
        textwrap.dedent(
            """
            import time

            import aiohttp
            from aiohttp import web

            from kapok.server.routes.middlewares import error_middleware


            async def stalling(request):
                time.sleep(0.05)  # noqa: ASYNC251
                return web.json_response({})


            async def test_stalls(aiohttp_server):
                app = web.Application(middlewares=[error_middleware])
                app.router.add_get("/", stalling)
                server = await aiohttp_server(app, host="127.0.0.1", port=0)
                async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{server.port}/") as r:
                    assert r.status == 200
            """
        )
    )
    # Only the plugins the file needs: loading every installed one takes seconds.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        OFF_SWITCH: "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin",
         "-p", "pytest_aiohttp.plugin", "-o", "asyncio_mode=auto",
         "-o", "asyncio_default_fixture_loop_scope=function", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=scaled(120), env=env, cwd=tmp_path,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 passed, 1 error" in out and "time.sleep on the event loop" in out and "in stalling" in out, out
