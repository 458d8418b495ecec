"""`kapok import-kapokmq`: a hand-made KapokMQ data directory, imported, then served."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from kapok.launch import start_node
from kapok.testing.slow import scaled

pytestmark = pytest.mark.e2e

REPLY_S = scaled(5.0)  # how long the node may take to answer a frame

PENDING = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
CONSUMED = "0123456789abcdef0123456789abcdef"
OLD = "fedcba9876543210fedcba9876543210"  # consumed before the retention window: not imported
CONSUMED_AT = int(time.time()) - 60


def gob_uint(n: int) -> bytes:
    """encoding/gob's unsigned integer: one byte below 128, else -(byte count) and big-endian bytes."""
    if n < 128:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([256 - len(raw)]) + raw


def kapokmq_dir(root: Path) -> Path:
    def msg(code: str, data: str, status: int, consumed: int = 0) -> dict[str, object]:
        return {
            "MessageCode": code, "MessageData": data, "Topic": "orders", "CreateTime": 1700000000,
            "ConsumedTime": consumed, "DelayTime": 0, "Status": status,
        }  # fmt: skip

    snapshot = orjson.dumps({PENDING: msg(PENDING, "from the snapshot", -1)})
    body = b"\x0a\x00" + gob_uint(len(snapshot)) + snapshot  # type id 5 ([]byte), field delta 0
    directory = root / "kapokmq"
    directory.mkdir()
    (directory / "MQDATA").write_bytes(gob_uint(len(body)) + body)
    wal = (
        orjson.dumps(msg(CONSUMED, "done", -1)) + b"\n" + orjson.dumps(msg(CONSUMED, "done", 1, CONSUMED_AT))
    )
    wal += b"\n" + orjson.dumps(msg(OLD, "long ago", 1, 1700000005))
    (directory / "WAL.log").write_bytes(wal + b"\n")
    return directory


def run_import(source: Path, data: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kapok", "import-kapokmq", str(source), "--set", f"storage.dir={data}"],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_import_then_serve(tmp_path: Path) -> None:
    source = kapokmq_dir(tmp_path)
    data = tmp_path / "node" / "data"
    assert "imported 2 of 3" in run_import(source, data)
    assert "imported 0 of 3" in run_import(source, data)  # importing twice adds nothing
    node = start_node(tmp_path / "node", f"storage.dir={data}")
    try:
        headers = {"secretKey": "test"}
        async with aiohttp.ClientSession() as session:
            form = {"messageCode": CONSUMED}
            async with session.post(node.url + "/Console/GetMessage", data=form, headers=headers) as resp:
                consumed = (await resp.json())["data"]
            assert consumed["Status"] == 1 and consumed["ConsumedTime"] == CONSUMED_AT
            async with session.ws_connect(node.ws_url + "/Consumers/Conn/orders/c1") as ws:
                assert await ws.receive_str(timeout=REPLY_S) == "Please enter the secret key"
                await ws.send_str("test")
                assert await ws.receive_str(timeout=REPLY_S) == "Secret key matching succeeded"
                pushed = await ws.receive_json(timeout=REPLY_S)
                assert (pushed["MessageCode"], pushed["MessageData"]) == (PENDING, "from the snapshot")
                await ws.send_str(PENDING)
    finally:
        assert node.stop() == 0, node.output


def test_import_of_a_missing_directory_is_one_clear_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kapok", "import-kapokmq", str(tmp_path / "nope"),
         "--set", f"storage.dir={tmp_path / 'data'}"],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.startswith("kapok: error:") and "Traceback" not in out.stderr
