"""``kapok.server.aiohttp_seam``: each hook into aiohttp's internals is checked as the node starts.

On the installed aiohttp every hook is there. With one taken away (aiohttp's attribute
removed for the test), a correctness hook stops the node with one line naming the hook
and the aiohttp version, and an optimisation hook is one WARNING and a gauge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp._websocket.helpers
import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

import kapok.logs
from kapok.cli import main
from kapok.config import load_config
from kapok.errors import ConfigError
from kapok.node.app import make_app
from kapok.server import aiohttp_seam
from kapok.server.aiohttp_seam import COMPILED_UNMASK, HOOKS, KEPT_BODY, TAKEOVER, check_hooks
from kapok.server.keys import REGISTRY


@pytest.fixture(autouse=True)
def fresh_seam(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a new process would: nothing checked, nothing said yet."""
    monkeypatch.setattr(aiohttp_seam, "_missing", None)
    monkeypatch.setattr(aiohttp_seam, "_warned", set())
    yield
    # What a test removed from aiohttp is back (monkeypatch undoes it before this
    # module's state): the next check sees the real aiohttp again.


def test_every_hook_is_there_on_the_installed_aiohttp(caplog: pytest.LogCaptureFixture) -> None:
    assert {hook.name: hook.probe() for hook in HOOKS} == {hook.name: None for hook in HOOKS}
    assert check_hooks() == frozenset()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_takeover_is_a_correctness_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it no WebSocket could be read: the node has no other frame reader."""
    assert next(h for h in HOOKS if h.name == TAKEOVER).required
    monkeypatch.delattr(RequestHandler, "_message_tail")
    with pytest.raises(ConfigError) as caught:
        check_hooks()
    message = caught.value.message
    assert "\n" not in message
    assert TAKEOVER in message and f"aiohttp {aiohttp.__version__}" in message
    assert "_message_tail" in message and "WebSocket" in message


async def test_a_node_refuses_to_start_without_the_takeover_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = load_config(None, overrides=[f"storage.dir={tmp_path}"], env={})
    runner = web.AppRunner(make_app(config))
    monkeypatch.delattr(RequestHandler, "_message_tail")
    try:
        with pytest.raises(ConfigError, match=TAKEOVER):
            await runner.setup()  # the guard's context comes first: nothing else started
    finally:
        monkeypatch.undo()
        await runner.cleanup()


def test_kapok_serve_exits_with_one_line_naming_the_hook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delattr(RequestHandler, "_message_tail")
    # `serve` sets up logging for the process (a handler on stderr): give it back afterwards,
    # or every later test's captured stderr holds log lines.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(kapok.logs, "_handler", None)
    code = main(["serve", "--set", f"storage.dir={tmp_path}", "--set", "server.port=0"])
    out, err = capsys.readouterr()
    assert code != 0
    assert "listening" not in out
    assert err.endswith("\n") and err.count("\n") == 1, err  # nothing logged before: storage not opened
    assert err.startswith("kapok: error: ") and TAKEOVER in err and aiohttp.__version__ in err, err


def test_a_missing_optimisation_hook_warns_once_and_counts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(web.BaseRequest, "_read_bytes")
    monkeypatch.delattr(aiohttp._websocket.helpers, "websocket_mask")
    caplog.set_level(logging.WARNING, logger="kapok.server")
    assert check_hooks() == {KEPT_BODY, COMPILED_UNMASK}
    assert check_hooks() == {KEPT_BODY, COMPILED_UNMASK}  # the node may check again
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # once per hook, not per check
    assert all(aiohttp.__version__ in w for w in warnings)
    assert any(KEPT_BODY in w for w in warnings) and any(COMPILED_UNMASK in w for w in warnings)
    assert aiohttp_seam.missing_hooks() == {KEPT_BODY, COMPILED_UNMASK}
    assert aiohttp_seam.compiled_unmask() is None


async def test_the_gauge_shows_missing_optimisation_hooks(node: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = node.app[REGISTRY]

    def gauge(hook: str) -> float | None:
        value: float | None = registry.get_sample_value("kapok_aiohttp_hooks_missing", {"hook": hook})
        return value

    assert gauge(KEPT_BODY) == 0
    assert gauge(TAKEOVER) is None  # a correctness hook is never missing on a running node
    monkeypatch.delattr(web.BaseRequest, "_read_bytes")
    check_hooks()
    assert gauge(KEPT_BODY) == 1
    assert gauge(COMPILED_UNMASK) == 0
