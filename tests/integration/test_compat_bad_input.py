"""Bad input on the KapokMQ-compatible routes: every malformed frame,
form or name gets a clear error or is counted, no traceback reaches the client,
and the node keeps serving: each test ends with a well-behaved client that
publishes and consumes successfully."""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType

from kapok.testing import eventually
from kapok.testing.slow import scaled

SECRET = "test"
ASK_KEY = "Please enter the secret key"
KEY_OK = "Secret key matching succeeded"
KEY_ERROR = "Secret key matching error"
T = scaled(5.0)  # upper bound of every single wait
MESSAGE_TOO_BIG = 1009


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def recv_text(ws: aiohttp.ClientWebSocketResponse, timeout: float = T) -> str:
    msg = await ws.receive(timeout=timeout)
    assert msg.type is WSMsgType.TEXT, f"expected a TEXT frame, got {msg.type!r} {msg.data!r}"
    return str(msg.data)


async def handshake(ws: aiohttp.ClientWebSocketResponse) -> None:
    assert await recv_text(ws) == ASK_KEY
    await ws.send_str(SECRET)
    assert await recv_text(ws) == KEY_OK


async def expect_error_reply(ws: aiohttp.ClientWebSocketResponse, *words: str) -> str:
    """The next frame is ``{"code":-1,"msg":"<readable text>"}``; returns the msg."""
    body = json.loads(await recv_text(ws))
    assert isinstance(body, dict) and set(body) == {"code", "msg"}, body
    assert body["code"] == -1
    msg = body["msg"]
    assert isinstance(msg, str) and msg and "Traceback" not in msg
    for word in words:
        assert word.lower() in msg.lower(), (word, msg)
    return msg


async def console(session: aiohttp.ClientSession, node: Any, name: str, **form: str) -> Any:
    async with session.post(f"{node.url}/Console/{name}", data=form, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        return await resp.json()


async def stored(session: aiohttp.ClientSession, node: Any) -> int:
    return int((await console(session, node, "CountMessage"))["data"]["all"])


async def bad_input_count(session: aiohttp.ClientSession, node: Any, kind: str) -> float:
    async with session.get(node.url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    m = re.search(rf'^kapok_bad_input_total\{{kind="{re.escape(kind)}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def wait_bad_input(session: aiohttp.ClientSession, node: Any, kind: str, at_least: float) -> None:
    async def reached() -> bool:
        return await bad_input_count(session, node, kind) >= at_least

    await eventually(reached, what=f"kapok_bad_input_total{{kind={kind!r}}} at {at_least}")


async def assert_node_serves(session: aiohttp.ClientSession, node: Any, topic: str = "healthy") -> None:
    """A fresh, well-behaved producer and consumer still work end to end."""
    async with (
        session.ws_connect(f"{node.ws_url}/Consumers/Conn/{topic}/good-c") as cons,
        session.ws_connect(f"{node.ws_url}/Producers/Conn/{topic}/good-p") as prod,
    ):
        await handshake(cons)
        await handshake(prod)
        await prod.send_str(json.dumps({"MessageData": "still alive", "DelayTime": 0}))
        assert await recv_text(prod) == "ok"
        push = json.loads(await recv_text(cons))
        assert push["MessageData"] == "still alive" and push["Topic"] == topic
        await cons.send_str(push["MessageCode"])

        async def consumed() -> bool:
            got = await console(session, node, "GetMessage", messageCode=push["MessageCode"])
            return bool(got["data"]["Status"] == 1)

        await eventually(consumed, what="the ack of the healthy message applied")
    async with session.get(node.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"


async def send_oversize(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    """Send a frame the server refuses from its header: it closes (1009) while we still write,
    so the write itself may fail with a reset; the close frame is read concurrently."""
    sender = asyncio.ensure_future(ws.send_str(text))
    try:
        msg = await ws.receive(timeout=T)
    finally:
        await asyncio.wait([sender], timeout=T)
        if not sender.cancelled():
            sender.exception()  # a reset while writing is expected
    assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED), (msg.type, msg.data)
    assert ws.close_code == MESSAGE_TOO_BIG


# ---------------------------------------------------------------- producer frames


@pytest.mark.parametrize(
    ("frame", "words"),
    [
        ("{not json", ("json",)),
        ('{"MessageData": "x", "DelayTime": 0', ("json",)),
        ("", ("json",)),
        ("   ", ("json",)),
        ("ok", ("json",)),
        ('"just a string"', ("object",)),
        ("[1, 2, 3]", ("object",)),
        ("42", ("object",)),
        ("null", ("object",)),
        ("true", ("object",)),
        ('{"MessageData": 5, "DelayTime": 0}', ("MessageData",)),
        ('{"MessageData": {"nested": true}, "DelayTime": 0}', ("MessageData",)),
        ('{"MessageData": ["a"], "DelayTime": 0}', ("MessageData",)),
        ('{"MessageData": "x", "DelayTime": "1"}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": 1.5}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": 1.0}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": true}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": [1]}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": 1e400}', ()),
        ('{"MessageData": "x", "DelayTime": 99999999999999999999999999}', ("DelayTime",)),
        ('{"MessageData": "x", "DelayTime": 99999999999}', ("DelayTime",)),
        ('{"messagedata": 1}', ("MessageData",)),
        ("{}", ("MessageData",)),  # once stored as an empty message
        ('{"DelayTime": 0}', ("MessageData",)),
        ('{"Message": "x"}', ("MessageData",)),
    ],
)
async def test_producer_bad_frame_gets_error_and_stays_open(
    node: Any, session: aiohttp.ClientSession, frame: str, words: tuple[str, ...]
) -> None:
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as ws:
        await handshake(ws)
        await ws.send_str(frame)
        await expect_error_reply(ws, *words)
        assert not ws.closed
        await ws.send_str('{"MessageData": "good", "DelayTime": 0}')
        assert await recv_text(ws) == "ok"
    assert await stored(session, node) == 1
    assert await bad_input_count(session, node, "compat_producer_frame") >= 1
    await assert_node_serves(session, node)


@pytest.mark.parametrize("payload", [b'{"MessageData": "x", "DelayTime": 0}', b"\x00\xff\xfe", b""])
async def test_producer_binary_frame(node: Any, session: aiohttp.ClientSession, payload: bytes) -> None:
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as ws:
        await handshake(ws)
        await ws.send_bytes(payload)
        await expect_error_reply(ws, "text")
        assert not ws.closed
        await ws.send_str('{"MessageData": "good", "DelayTime": 0}')
        assert await recv_text(ws) == "ok"
    assert await stored(session, node) == 1
    assert await bad_input_count(session, node, "compat_binary_frame") == 1
    await assert_node_serves(session, node)


async def test_producer_invalid_utf8_text_frame(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as ws:
        await handshake(ws)
        await ws.send_frame(b'{"MessageData": "\xff\xfe"}', WSMsgType.TEXT)
        msg = await ws.receive(timeout=T)
        # RFC 6455 §8.1: a text frame that is not UTF-8 fails the connection with 1007
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
        assert ws.close_code == 1007
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


async def test_producer_message_over_max_message_bytes(
    make_node: Any, session: aiohttp.ClientSession
) -> None:
    node = await make_node("mq.max_message_bytes=1000", "server.send_queue_max_bytes=100000")
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as ws:
        await handshake(ws)
        await ws.send_str(json.dumps({"MessageData": "x" * 1001, "DelayTime": 0}))
        await expect_error_reply(ws, "max_message_bytes")
        await ws.send_str(json.dumps({"MessageData": "é" * 501, "DelayTime": 0}))  # 1002 UTF-8 bytes
        await expect_error_reply(ws, "max_message_bytes")
        await ws.send_str(json.dumps({"MessageData": "x" * 1000, "DelayTime": 0}))
        assert await recv_text(ws) == "ok"
    assert await stored(session, node) == 1
    # the same limit on HTTP
    form = {"messageData": "y" * 1001, "topic": "jobs", "delayTime": "0"}
    async with session.post(node.url + "/Producer/Send", data=form, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["code"] == -1 and "max_message_bytes" in body["msg"]
    assert await stored(session, node) == 1
    await assert_node_serves(session, node)


async def test_oversize_frame_closes_with_1009(make_node: Any, session: aiohttp.ClientSession) -> None:
    # frame limit = max(4 * max_message_bytes, 8 MiB) + max_batch * 512 = 8 MiB + 512 bytes
    node = await make_node(
        "mq.max_message_bytes=1000", "server.max_batch=1", "server.send_queue_max_bytes=100000"
    )
    huge = json.dumps({"MessageData": "z" * (9 * 1024 * 1024), "DelayTime": 0})
    for route in ("Producers", "Consumers"):
        async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/big") as ws:
            await handshake(ws)
            await send_oversize(ws, huge)
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


async def test_oversize_handshake_frame_closes(make_node: Any, session: aiohttp.ClientSession) -> None:
    node = await make_node(
        "mq.max_message_bytes=1000", "server.max_batch=1", "server.send_queue_max_bytes=100000"
    )
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/big") as ws:
        assert await recv_text(ws) == ASK_KEY
        await send_oversize(ws, "k" * (9 * 1024 * 1024))
    await assert_node_serves(session, node)


async def test_oversize_http_body(make_node: Any, session: aiohttp.ClientSession) -> None:
    node = await make_node(
        "mq.max_message_bytes=1000", "server.max_batch=1", "server.send_queue_max_bytes=100000"
    )
    body = io.BytesIO(b"topic=jobs&delayTime=0&messageData=" + b"z" * (9 * 1024 * 1024))
    headers = {"secretKey": SECRET, "Content-Type": "application/x-www-form-urlencoded"}
    async with session.post(node.url + "/Producer/Send", data=body, headers=headers) as resp:
        text = await resp.text()
        assert resp.status in (200, 413), (resp.status, text)
    reply = json.loads(text)
    assert reply.get("code", -1) == -1 and "Traceback" not in text
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


# ---------------------------------------------------------------- consumer frames


async def test_consumer_binary_and_unknown_acks_are_counted_not_answered(
    node: Any, session: aiohttp.ClientSession
) -> None:
    async with (
        session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as cons,
        session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as prod,
    ):
        await handshake(cons)
        await handshake(prod)
        await prod.send_str('{"MessageData": "first", "DelayTime": 0}')
        assert await recv_text(prod) == "ok"
        push = json.loads(await recv_text(cons))
        code = push["MessageCode"]
        await cons.send_bytes(code.encode())  # a binary frame is not an ack
        await cons.send_bytes(b"\x00\x01\x02")
        await cons.send_str("0" * 32)  # unknown code
        await cons.send_str("not a code at all")
        await cons.send_str(json.dumps({"MessageCode": code}))  # JSON is not the raw code
        await cons.send_str("")
        await wait_bad_input(session, node, "compat_binary_frame", 2)
        await wait_bad_input(session, node, "compat_unknown_ack", 4)
        # the message is still unacked
        assert (await console(session, node, "GetMessage", messageCode=code))["data"]["Status"] == -1
        # the connection still works: a real ack consumes it, and the next push arrives; it is
        # the next frame at all, so none of the bad acks above was answered
        await cons.send_str(code)
        await prod.send_str('{"MessageData": "second", "DelayTime": 0}')
        assert await recv_text(prod) == "ok"
        nxt = json.loads(await recv_text(cons))
        assert nxt["MessageData"] == "second"
        await cons.send_str(nxt["MessageCode"])
        assert (await console(session, node, "GetMessage", messageCode=code))["data"]["Status"] == 1
    await assert_node_serves(session, node)


async def test_consumer_acking_a_code_it_does_not_hold(node: Any, session: aiohttp.ClientSession) -> None:
    """KapokMQ bug 19: any connection could ack any code, even a never-delivered delayed one."""
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/jobs/p1") as prod:
        await handshake(prod)
        await prod.send_str('{"MessageData": "later", "DelayTime": 300}')
        assert await recv_text(prod) == "ok"
    (row,) = (await console(session, node, "GetMessageList", status="3"))["data"]
    code = row["MessageCode"]
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as cons:
        await handshake(cons)
        await cons.send_str(code)
        await wait_bad_input(session, node, "compat_unknown_ack", 1)
    got = (await console(session, node, "GetMessage", messageCode=code))["data"]
    assert got["Status"] == 0 and got["ConsumedTime"] == 0
    await assert_node_serves(session, node)


# ---------------------------------------------------------------- names and keys


@pytest.mark.parametrize("topic", ["bad%20topic", "tab%09topic", "x" * 256])
async def test_bad_topic_in_producer_url(node: Any, session: aiohttp.ClientSession, topic: str) -> None:
    async with session.ws_connect(f"{node.ws_url}/Producers/Conn/{topic}/p1") as ws:
        await handshake(ws)
        await ws.send_str('{"MessageData": "x", "DelayTime": 0}')
        await expect_error_reply(ws, "topic")
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


@pytest.mark.parametrize("topic", ["bad%20topic", "tab%09topic", "x" * 256])
async def test_bad_topic_in_consumer_url(node: Any, session: aiohttp.ClientSession, topic: str) -> None:
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/{topic}/c1") as ws:
        await handshake(ws)
        await expect_error_reply(ws, "topic")
        msg = await ws.receive(timeout=T)
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
    assert not (await console(session, node, "GetClients"))["consumers"]
    await assert_node_serves(session, node)


@pytest.mark.parametrize("topic", ["bad topic", "a/b", "x" * 256, "new\nline"])
async def test_bad_topic_on_http_send(node: Any, session: aiohttp.ClientSession, topic: str) -> None:
    form = {"messageData": "x", "topic": topic, "delayTime": "0"}
    async with session.post(node.url + "/Producer/Send", data=form, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        body = await resp.json()
    assert set(body) == {"code", "msg"} and body["code"] == -1 and "topic" in body["msg"].lower()
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


async def test_wrong_keys_everywhere_then_node_serves(make_node: Any, session: aiohttp.ClientSession) -> None:
    node = await make_node("server.auth_max_attempts=1")
    for route in ("Producers", "Consumers"):
        for key in ("", "TEST", "test ", "x" * 10000):
            async with session.ws_connect(f"{node.ws_url}/{route}/Conn/jobs/bad") as ws:
                assert await recv_text(ws) == ASK_KEY
                await ws.send_str(key)
                assert await recv_text(ws) == KEY_ERROR
                msg = await ws.receive(timeout=T)
                assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
                assert ws.close_code == 1008
    async with session.post(f"{node.url}/Console/Ping", headers={"secretKey": "TEST"}) as resp:
        assert await resp.json() == {"code": -1, "msg": KEY_ERROR}
    async with session.get(node.url + "/metrics") as resp:
        text = await resp.text()
    m = re.search(r"^kapok_auth_failures_total (\S+)$", text, re.M)
    assert m and float(m.group(1)) >= 9
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


async def test_unknown_routes_and_methods(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.post(node.url + "/Console/Nope", headers={"secretKey": SECRET}) as resp:
        assert resp.status == 404
        assert "Traceback" not in await resp.text()
    async with session.get(node.url + "/Console/Ping", headers={"secretKey": SECRET}) as resp:
        assert resp.status == 405
    async with session.get(node.url + "/Producers/Conn/jobs/p1") as resp:  # not an upgrade
        assert resp.status >= 400 and resp.status != 500
        assert "Traceback" not in await resp.text()
    await assert_node_serves(session, node)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"messageData=\xff\xfe&topic=jobs&delayTime=0"),
        (
            "application/x-www-form-urlencoded; charset=no-such-charset",
            b"messageData=a&topic=jobs&delayTime=0",
        ),
        ("multipart/form-data", b"messageData=a&topic=jobs&delayTime=0"),
        ("multipart/form-data; boundary=XX", b"not multipart at all"),
    ],
    ids=["raw-invalid-utf8", "unknown-charset", "multipart-no-boundary", "multipart-garbage"],
)
async def test_malformed_form_body(
    node: Any, session: aiohttp.ClientSession, content_type: str, body: bytes
) -> None:
    headers = {"secretKey": SECRET, "Content-Type": content_type}
    for path in ("/Producer/Send", "/Console/GetMessageList", "/Console/GetMessage"):
        async with session.post(node.url + path, data=io.BytesIO(body), headers=headers) as resp:
            text = await resp.text()
            assert resp.status in (200, 400), (path, resp.status, text)
        reply = json.loads(text)
        if resp.status == 200:
            assert reply["code"] == -1 and isinstance(reply["msg"], str) and reply["msg"], (path, reply)
        assert "internal" not in text and "Traceback" not in text, (path, text)
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


async def test_send_json_body_is_not_a_form(node: Any, session: aiohttp.ClientSession) -> None:
    body = {"messageData": "x", "topic": "jobs", "delayTime": "0"}
    async with session.post(node.url + "/Producer/Send", json=body, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        assert await resp.json() == {"code": -1, "msg": "Required data cannot be empty"}
    assert await stored(session, node) == 0
    await assert_node_serves(session, node)


def _client_frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame (a zero mask key: the payload goes as it is)."""
    assert len(payload) < 126
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\0\0\0\0" + payload


async def test_a_burst_of_good_bad_and_control_frames_is_answered_in_order(
    node: Any, session: aiohttp.ClientSession
) -> None:
    """Frames parsed together (one TCP write) are taken from aiohttp's queue without a
    receive() each: every text and binary frame still gets its reply in order."""
    good = b'{"MessageData": "m", "DelayTime": 0}'
    burst = (
        _client_frame(1, good) * 50
        + _client_frame(2, good)  # binary: an error reply, in its place
        + _client_frame(1, b"{not json")
        + _client_frame(9, b"hi")  # ping: answered by a pong
        + _client_frame(1, good) * 50
    )
    host, port = node.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"GET /Producers/Conn/jobs/p1 HTTP/1.1\r\nHost: x\r\n"
            b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), T)
        assert head.startswith(b"HTTP/1.1 101")

        async def frame() -> tuple[int, bytes]:
            first, size = await asyncio.wait_for(reader.readexactly(2), T)
            assert size < 126
            return first & 0x0F, await asyncio.wait_for(reader.readexactly(size), T)

        assert await frame() == (1, ASK_KEY.encode())
        writer.write(_client_frame(1, SECRET.encode()))
        assert await frame() == (1, KEY_OK.encode())
        writer.write(burst)
        got = [await frame() for _ in range(50 + 2 + 1 + 50)]
    finally:
        writer.close()
    assert got.count((10, b"hi")) == 1  # the pong (it needs no WAL write, so it may come first)
    replies = [data for opcode, data in got if opcode == 1]
    assert replies[:50] == [b"ok"] * 50
    assert b"text" in replies[50]
    assert json.loads(replies[51])["code"] == -1
    assert replies[52:] == [b"ok"] * 50
    assert await stored(session, node) == 100
    await assert_node_serves(session, node)
