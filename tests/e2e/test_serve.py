"""`kapok serve` as a real process: starts on the shipped config, serves, stops cleanly."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from kapok.launch import start_node
from kapok.testing.slow import scaled

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
REPLY_S = scaled(5.0)  # how long the node may take to answer a frame


async def test_serve_with_shipped_config_round_trip(tmp_path: Path) -> None:
    shutil.copy(REPO / "application.yaml", tmp_path / "application.yaml")
    node = start_node(tmp_path)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(node.url + "/health") as resp:
                health = await resp.json()
            assert health["status"] == "ok" and health["role"] == "master" and health["active"] is True
            async with session.ws_connect(node.ws_url + "/Producers/Conn/jobs/p1") as producer:
                assert await producer.receive_str(timeout=REPLY_S) == "Please enter the secret key"
                await producer.send_str("test")
                assert await producer.receive_str(timeout=REPLY_S) == "Secret key matching succeeded"
                await producer.send_str('{"MessageData": "hello", "DelayTime": 0}')
                assert await producer.receive_str(timeout=REPLY_S) == "ok"
            async with session.ws_connect(node.ws_url + "/Consumers/Conn/jobs/c1") as consumer:
                assert await consumer.receive_str(timeout=REPLY_S) == "Please enter the secret key"
                await consumer.send_str("test")
                assert await consumer.receive_str(timeout=REPLY_S) == "Secret key matching succeeded"
                pushed = await consumer.receive_json(timeout=REPLY_S)
                assert pushed["MessageData"] == "hello" and pushed["Topic"] == "jobs"
                await consumer.send_str(pushed["MessageCode"])
    finally:
        code = node.stop()
    assert code == 0, node.output
    assert "shutting down" in node.output


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as info:
        start_node(tmp_path, "server.port=abc", timeout_s=scaled(10))
    lines = [line for line in str(info.value).splitlines() if line.strip()]
    assert any(line.startswith("kapok: error: server.port") for line in lines), lines
    assert "Traceback" not in str(info.value)
