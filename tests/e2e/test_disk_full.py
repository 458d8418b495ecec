"""A full disk under a real ``kapok serve``: refused writes, working consumers, healing.

Each test runs a node with its ``storage.dir`` on a small tmpfs (one per module, mounted
here: skipped only where mounting is not permitted), with ``storage.min_free_bytes`` at
1 MiB, and fills the tmpfs with a filler file until a write finds no space. Then:

* new messages are refused as ``storage_full`` by every protocol, and no connection is
  closed for it: 507 on the HTTP API, an ``error`` frame on the native WebSocket (which
  answers the next frame), ``{"code": -1}`` on a KapokMQ route;
* ``/health`` says ``degraded`` and why (and stays 200);
* a consumer drains the whole backlog meanwhile (its acks queue behind the full disk);
* once the filler is deleted, writes are confirmed again without a restart (the seconds
  it took are printed: run with ``-s``), and after kill -9 and a restart every confirmed
  message is either acked or still there;
* a node started on a full disk (with data from before) starts, says which path is full,
  serves its consumers, and stops on SIGTERM with exit 0 and no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.e2e.disks import mounted_tmpfs

from kapok.launch import NodeProcess, get_json, start_node, wait_for
from kapok.testing.nodehttp import metric, publish
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

AUTH = {"Authorization": "Bearer test", "Content-Type": "application/json"}
T = scaled(15.0)  # the bound of any single wait
HEAL_S = 10.0  # the promise: writes confirmed again this soon after space is freed
MIN_FREE = 1024 * 1024
TOPIC = "jobs"


# ---------------------------------------------------------------- the disk


@pytest.fixture(scope="module")
def tmpfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One small tmpfs for the module's tests (each uses a directory of its own in it)."""
    with mounted_tmpfs(tmp_path_factory.mktemp("disk"), "16m") as mount:
        yield mount


@pytest.fixture
def disk(tmpfs: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory on the tmpfs; everything in it, filler included, goes afterwards."""
    directory = tmpfs / request.node.name[:40]
    directory.mkdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def fill(path: Path) -> int:
    """Write ``path`` until the file system has no space left; the bytes written."""
    written = 0
    chunk = 1024 * 1024
    with path.open("wb", buffering=0) as f:
        for _ in range(10_000):  # bounded: 16 MiB in chunks down to 4 KiB
            try:
                written += f.write(bytes(chunk))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if chunk == 4096:
                    return written
                chunk //= 4
    raise AssertionError("the disk never filled up")


# ---------------------------------------------------------------- the node


def launch(workdir: Path, data: Path) -> NodeProcess:
    return start_node(
        workdir,
        f"storage.dir={data}",
        f"storage.min_free_bytes={MIN_FREE}",
        "storage.archive=false",
        timeout_s=scaled(30.0),
    )


def confirm(node: NodeProcess, n: int, tag: str) -> list[str]:
    """Publish ``n`` messages (batches of 50), each batch confirmed; their codes."""
    codes: list[str] = []
    while len(codes) < n:
        status, body = publish(node.url, *[f"{tag}{len(codes) + i}" for i in range(50)], topic=TOPIC)
        assert status == 200, (status, body)
        codes += body["codes"]
    return codes


def request_json(node: NodeProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.url + path, data=data, headers=AUTH, method=method)
    try:
        with urllib.request.urlopen(req, timeout=T) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def drain_some(node: NodeProcess, most: int) -> list[str]:
    """Lease and ack up to ``most`` messages of the default group, 25 at a time; their codes."""
    acked: list[str] = []
    while len(acked) < most:
        status, body = request_json(node, "GET", f"/v1/topics/{TOPIC}/messages?max=25&group=default")
        assert status == 200, body
        codes = [m["code"] for m in body["messages"]]
        if not codes:
            break
        status, done = request_json(
            node, "POST", f"/v1/topics/{TOPIC}/ack", {"group": "default", "codes": codes}
        )
        assert status == 200 and done["settled"] == len(codes), done
        acked += codes
    return acked


def degraded(node: NodeProcess) -> bool:
    health = get_json(node, "/health")
    return health is not None and health["status"] == "degraded"


def compat_send(node: NodeProcess, data: str) -> dict[str, Any]:
    form = urllib.parse.urlencode({"messageData": data, "topic": TOPIC, "delayTime": "0"}).encode()
    req = urllib.request.Request(node.url + "/Producer/Send", data=form, headers={"secretKey": "test"})
    with urllib.request.urlopen(req, timeout=T) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


async def native_refusal(node: NodeProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``pub`` on the native WebSocket, and a ``ping`` after it: both answers."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=T)) as session,
        session.ws_connect(f"{node.ws_url}/v1/ws?client=full", headers=AUTH) as ws,
    ):
        await ws.send_str(json.dumps({"op": "pub", "id": 1, "topic": TOPIC, "msgs": [{"data": "x"}]}))
        refused = json.loads(await ws.receive_str(timeout=T))
        await ws.send_str(json.dumps({"op": "ping", "id": 2}))
        pong = json.loads(await ws.receive_str(timeout=T))
        return refused, pong


async def compat_ws_refusals(node: NodeProcess) -> list[dict[str, Any]]:
    """Two messages on a KapokMQ producer socket (after its in-band key): both answers."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=T)) as session,
        session.ws_connect(f"{node.ws_url}/Producers/Conn/{TOPIC}/full") as ws,
    ):
        await ws.receive_str(timeout=T)  # the key, please
        await ws.send_str("test")
        await ws.receive_str(timeout=T)  # accepted
        answers = []
        for _ in range(2):
            await ws.send_str(json.dumps({"MessageData": "x", "DelayTime": 0}))
            answers.append(json.loads(await ws.receive_str(timeout=T)))
        return answers


def held_codes(node: NodeProcess) -> set[str]:
    """Every message the default group holds, leased for long (a restart's recovery)."""
    held: set[str] = set()
    for _ in range(100):
        status, body = request_json(
            node, "GET", f"/v1/topics/{TOPIC}/messages?max=1000&group=default&lease_s=600"
        )
        assert status == 200, body
        if not body["messages"]:
            return held
        held |= {m["code"] for m in body["messages"]}
    raise AssertionError("the topic never ran dry")


# ---------------------------------------------------------------- the tests


def test_a_full_disk_refuses_new_messages_serves_consumers_and_heals_without_a_restart(
    tmp_path: Path, disk: Path
) -> None:
    data = disk / "data"
    node = launch(tmp_path / "node", data)
    try:
        confirmed = confirm(node, 600, "before-")
        assert get_json(node, "/health")["status"] == "ok"
        filler = disk / "filler"
        fill(filler)
        wait_for(lambda: degraded(node), T, 0.1)
        health = get_json(node, "/health")
        assert health["reason"].startswith("storage_full: ") and str(disk) in health["reason"], health
        assert metric(node.url, "kapok_storage_disk_full") == 1

        # Refused by every protocol, the connection kept.
        status, body = publish(node.url, "refused", topic=TOPIC)
        assert status == 507 and body["error"] == "storage_full", (status, body)
        assert str(disk) in body["message"] and "bytes free" in body["message"], body
        refused, pong = asyncio.run(native_refusal(node))
        assert refused["op"] == "error" and refused["code"] == "storage_full" and refused["id"] == 1, refused
        assert pong["op"] == "pong" and pong["id"] == 2, pong
        compat = compat_send(node, "refused")
        assert compat["code"] == -1 and "storage full" in compat["msg"], compat
        for answer in asyncio.run(compat_ws_refusals(node)):
            assert answer["code"] == -1 and "storage full" in answer["msg"], answer

        # Consumers go on: the whole backlog is drained while the disk is full (the acks'
        # records wait for space in memory: the disk has none left at all).
        acked = drain_some(node, 10_000)
        assert sorted(acked) == sorted(confirmed)
        assert degraded(node)
        status, body = publish(node.url, "still refused", topic=TOPIC)
        assert status == 507, (status, body)

        filler.unlink()  # space again: writes are confirmed again, no restart
        freed = time.monotonic()
        healed: list[str] = []

        def writes_again() -> bool:
            status, body = publish(node.url, "healed", topic=TOPIC)
            assert status in (200, 507), (status, body)
            if status == 200:
                healed.extend(body["codes"])
            return status == 200

        wait_for(writes_again, scaled(HEAL_S), 0.1)
        seconds = time.monotonic() - freed
        print(f"\nwrites confirmed again {seconds:.2f} s after space was freed")
        assert seconds <= scaled(HEAL_S)
        confirmed += healed + confirm(node, 100, "after-")
        wait_for(lambda: not degraded(node), T, 0.1)
        assert node.alive()
        assert node.output.count("kapok.storage: recovered ") == 1  # one start: no restart
        assert "Traceback" not in node.output
        errors = [line for line in node.output.splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "storage full" in errors[0] and str(disk) in errors[0], errors
        assert "the write-ahead log cannot write" in node.output  # the acks did wait for space

        # Every confirmed message is either acked or still held, also after a crash (the
        # acks made on the full disk were written once space was back).
        node.kill()
        node = launch(tmp_path / "node", data)
        held = held_codes(node)
        assert held == set(confirmed) - set(acked), (len(held), len(confirmed), len(acked))
        assert not degraded(node)
    finally:
        node.stop()


def test_a_node_started_on_a_full_disk_serves_consumers_and_stops_cleanly(tmp_path: Path, disk: Path) -> None:
    data = disk / "data"
    node = launch(tmp_path / "node", data)
    try:
        confirmed = confirm(node, 400, "m")
    finally:
        assert node.stop() == 0
    filler = disk / "filler"
    fill(filler)
    node = launch(tmp_path / "node", data)  # starts: before, it exited 1 with [Errno 28]
    try:
        assert degraded(node)  # at once: the first probe precedes serving
        lines = [line for line in node.output.splitlines() if " ERROR " in line]
        assert len(lines) == 1 and "storage full" in lines[0] and str(data) in lines[0], lines
        status, body = publish(node.url, "refused", topic=TOPIC)
        assert status == 507 and body["error"] == "storage_full", (status, body)
        acked = drain_some(node, 1000)
        assert sorted(acked) == sorted(confirmed)
    finally:
        code = node.stop()
    output = node.output
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "no shutdown snapshot" in output and "stopped cleanly" in output, output[-3000:]
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
