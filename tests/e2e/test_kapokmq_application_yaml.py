"""KapokMQ's own application.yaml (read from KapokMQ's sources at test time): ``kapok serve``
runs on it and serves KapokMQ clients, saying what became of every key; ``kapok config
convert`` turns it into a Kapok file that ``kapok check`` reads to the same effective values.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from kapok.config.kapokmq import is_kapokmq
from kapok.launch import start_node
from kapok.testing.slow import scaled

pytestmark = pytest.mark.e2e

REPLY_S = scaled(5.0)  # how long the node may take to answer a frame


def kapok(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    return subprocess.run(
        [sys.executable, "-m", "kapok", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=scaled(60), check=False,
    )  # fmt: skip


def kapokmq_keys(path: Path) -> list[str]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [f"{section}.{key}" for section, body in raw.items() for key in body]


async def handshake(ws: aiohttp.ClientWebSocketResponse) -> None:
    """KapokMQ's in-band handshake with the shipped key."""
    assert await ws.receive_str(timeout=REPLY_S) == "Please enter the secret key"
    await ws.send_str("test")
    assert await ws.receive_str(timeout=REPLY_S) == "Secret key matching succeeded"


async def test_serve_on_kapokmq_application_yaml_serves_kapokmq_clients(
    tmp_path: Path, kapokmq_yaml: Path
) -> None:
    text = await asyncio.to_thread(kapokmq_yaml.read_text, encoding="utf-8")
    node = await asyncio.to_thread(start_node, tmp_path, config_text=text)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(node.ws_url + "/Producers/Conn/jobs/p1") as producer:
                await handshake(producer)
                await producer.send_str('{"MessageData": "over ws", "DelayTime": 0}')
                assert await producer.receive_str(timeout=REPLY_S) == "ok"
            form = {"messageData": "over http", "topic": "jobs", "delayTime": "0"}
            send = node.url + "/Producer/Send"
            async with session.post(send, data=form, headers={"secretKey": "test"}) as resp:
                sent = await resp.json(content_type=None)
            assert sent["code"] == 0, sent
            async with session.ws_connect(node.ws_url + "/Consumers/Conn/jobs/c1") as consumer:
                await handshake(consumer)
                received = []
                for _ in range(2):
                    pushed = await consumer.receive_json(timeout=REPLY_S)
                    received.append(pushed["MessageData"])
                    await consumer.send_str(pushed["MessageCode"])
            assert sorted(received) == ["over http", "over ws"]
    finally:
        code = node.stop()
    assert code == 0, node.output
    # One line per KapokMQ key: what it became, or why it is ignored.
    lines = node.output.splitlines()
    for key in kapokmq_keys(kapokmq_yaml):
        said = [line for line in lines if f" kapok.config: {key}: " in line]
        assert len(said) == 1, (key, said)
        assert " -> " in said[0]
    assert any("mq.secretKey: (hidden) -> mq.secret_key: (hidden)" in line for line in lines)
    assert (tmp_path / "data" / "wal").is_dir()  # mq.persistentFile: MQDATA -> storage.dir: data


def test_convert_round_trips_through_check(tmp_path: Path, kapokmq_yaml: Path) -> None:
    converted = kapok("config", "convert", str(kapokmq_yaml), cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    target = tmp_path / "application.yaml"
    target.write_text(converted.stdout, encoding="utf-8")
    assert not is_kapokmq(yaml.safe_load(converted.stdout))  # a Kapok file through and through
    for key in kapokmq_keys(kapokmq_yaml):
        assert f"#   {key}: " in converted.stdout, key  # each key's fate, as a comment

    direct = kapok("check", "-c", str(kapokmq_yaml), cwd=tmp_path)
    via_file = kapok("check", "-c", str(target), cwd=tmp_path)
    assert direct.returncode == via_file.returncode == 0, direct.stderr + via_file.stderr
    assert direct.stdout == via_file.stdout
    effective = yaml.safe_load(direct.stdout)
    assert effective["mq"]["secret_key"] == "(hidden)" and effective["storage"]["fsync"] == "never"
    assert "mq.pushCount: 1000 -> ignored" in direct.stderr and "KapokMQ" not in via_file.stderr


def test_convert_of_a_kapok_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "application.yaml").write_text("server: {port: 9011}\n", encoding="utf-8")
    result = kapok("config", "convert", "application.yaml", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("kapok: error: application.yaml: not a KapokMQ configuration")
    assert len(result.stderr.splitlines()) == 1
