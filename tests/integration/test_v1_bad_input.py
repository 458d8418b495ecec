"""Bad input on the native protocols: a clear error, never a traceback, and the
node keeps serving: the same WebSocket still works and a second client publishes and
consumes fine afterwards."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from kapok.server.ws.base import frame_limit
from kapok.testing import eventually
from kapok.testing.slow import scaled
from kapok.testing.wsraw import client_frame

SUB = object()  # placeholder for the id of a real subscription on the connection
T = scaled(3.0)  # upper bound of every single wait


async def read_frame(ws: aiohttp.ClientWebSocketResponse, timeout: float = T) -> dict[str, Any]:
    msg = await ws.receive(timeout=timeout)
    assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), (msg.type, msg.data, msg.extra)
    text = msg.data if isinstance(msg.data, str) else msg.data.decode()
    assert "Traceback" not in text
    frame = json.loads(text)
    assert isinstance(frame, dict)
    return frame


async def reply(ws: aiohttp.ClientWebSocketResponse, rid: Any, timeout: float = T) -> dict[str, Any]:
    """The reply to request ``rid`` (pushes in between are skipped)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        frame = await read_frame(ws, max(deadline - loop.time(), 0.001))
        if frame.get("op") != "msg" and frame.get("id") == rid:
            return frame


async def still_serving(
    node: Any,
    session: aiohttp.ClientSession,
    auth: dict[str, str],
    ws: aiohttp.ClientWebSocketResponse | None,
) -> None:
    """``ws`` (if still open) answers a ping and publishes; a new client publishes and consumes."""
    topic = "after-error"
    expected = []
    if ws is not None:
        await ws.send_str(json.dumps({"op": "ping", "id": "p1"}))
        assert await reply(ws, "p1") == {"op": "pong", "id": "p1"}
        await ws.send_str(
            json.dumps({"op": "pub", "id": "p2", "topic": topic, "msgs": [{"data": "same-ws"}]})
        )
        assert (await reply(ws, "p2"))["op"] == "puback"
        expected.append("same-ws")
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as other:
        await other.send_str(json.dumps({"op": "pub", "id": 1, "topic": topic, "msgs": [{"data": "other"}]}))
        assert (await reply(other, 1))["op"] == "puback"
        expected.append("other")
        await other.send_str(json.dumps({"op": "sub", "id": 2, "topic": topic}))
        sub = (await reply(other, 2))["sub"]
        got: list[str] = []
        while len(got) < len(expected):
            frame = await read_frame(other)
            if frame.get("op") == "msg" and frame["sub"] == sub:
                got.extend(m["data"] for m in frame["msgs"])
        assert got == expected
    async with session.get(node.url + "/health") as resp:
        assert resp.status == 200


async def pull_all(node: Any, session: aiohttp.ClientSession, auth: dict[str, str], topic: str) -> list[Any]:
    async with session.get(f"{node.url}/v1/topics/{topic}/messages?max=1000", headers=auth) as resp:
        assert resp.status == 200
        messages: list[Any] = (await resp.json())["messages"]
        return messages


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


# ---------------------------------------------------------------- WebSocket frames

GOOD_MSG = {"data": "x"}

BAD_FRAMES: list[tuple[str, Any, str, bool]] = [
    # (case id, frame: raw text or an object, expected code, whether the reply echoes the id)
    ("malformed-json", '{"op": "pub", ', "bad_request", False),
    ("not-json-at-all", "hello", "bad_request", False),
    ("empty-frame", "", "bad_request", False),
    ("json-array", "[1, 2, 3]", "bad_request", False),
    ("json-string", '"ping"', "bad_request", False),
    ("json-number", "42", "bad_request", False),
    ("json-null", "null", "bad_request", False),
    ("missing-op", {"id": 9}, "unknown_op", True),
    ("unknown-op", {"op": "explode", "id": 9}, "unknown_op", True),
    ("op-not-string", {"op": 5, "id": 9}, "unknown_op", True),
    ("priority-string", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "x", "priority": "high"}]},
     "bad_request", True),
    ("priority-too-big", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "x", "priority": 10}]},
     "bad_request", True),
    ("msgs-not-list", {"op": "pub", "id": 9, "topic": "t", "msgs": "x"}, "bad_request", True),
    ("msgs-missing", {"op": "pub", "id": 9, "topic": "t"}, "bad_request", True),
    ("msgs-empty", {"op": "pub", "id": 9, "topic": "t", "msgs": []}, "bad_request", True),
    ("msg-string", {"op": "pub", "id": 9, "topic": "t", "msgs": ["x"]}, "bad_request", True),
    ("msg-list", {"op": "pub", "id": 9, "topic": "t", "msgs": [["x"]]}, "bad_request", True),
    ("msg-number", {"op": "pub", "id": 9, "topic": "t", "msgs": [1]}, "bad_request", True),
    ("msg-null", {"op": "pub", "id": 9, "topic": "t", "msgs": [None]}, "bad_request", True),
    ("data-number", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": 5}]}, "bad_request", True),
    ("data-missing", {"op": "pub", "id": 9, "topic": "t", "msgs": [{}]}, "bad_request", True),
    ("enc-rot13", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "x", "enc": "rot13"}]},
     "bad_request", True),
    ("bad-base64", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "!!not b64", "enc": "base64"}]},
     "bad_request", True),
    ("delay-negative", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "x", "delay_s": -1}]},
     "bad_request", True),
    ("delay-string", {"op": "pub", "id": 9, "topic": "t", "msgs": [{"data": "x", "delay_s": "soon"}]},
     "bad_request", True),
    ("topic-missing", {"op": "pub", "id": 9, "msgs": [GOOD_MSG]}, "bad_request", True),
    ("topic-number", {"op": "pub", "id": 9, "topic": 7, "msgs": [GOOD_MSG]}, "bad_request", True),
    ("topic-space", {"op": "pub", "id": 9, "topic": "a b", "msgs": [GOOD_MSG]}, "bad_request", True),
    ("topic-slash", {"op": "pub", "id": 9, "topic": "a/b", "msgs": [GOOD_MSG]}, "bad_request", True),
    ("topic-empty", {"op": "pub", "id": 9, "topic": "", "msgs": [GOOD_MSG]}, "bad_request", True),
    ("topic-too-long", {"op": "pub", "id": 9, "topic": "t" * 256, "msgs": [GOOD_MSG]}, "bad_request", True),
    ("batch-too-big", {"op": "pub", "id": 9, "topic": "t", "msgs": [GOOD_MSG] * 1001}, "bad_request", True),
    ("sub-topic-space", {"op": "sub", "id": 9, "topic": "a b"}, "bad_request", True),
    ("sub-topic-missing", {"op": "sub", "id": 9}, "bad_request", True),
    ("sub-prefetch-zero", {"op": "sub", "id": 9, "topic": "t", "prefetch": 0}, "bad_request", True),
    ("sub-prefetch-string", {"op": "sub", "id": 9, "topic": "t", "prefetch": "10"}, "bad_request", True),
    ("sub-ack-mode", {"op": "sub", "id": 9, "topic": "t", "ack": "sometimes"}, "bad_request", True),
    ("sub-group-number", {"op": "sub", "id": 9, "topic": "t", "group": 3}, "bad_request", True),
    ("sub-reserved-group", {"op": "sub", "id": 9, "topic": "t", "group": "~x"}, "bad_subscription", True),
    ("sub-group-space", {"op": "sub", "id": 9, "topic": "t", "group": "a b"}, "bad_request", True),
    ("sub-weight-zero", {"op": "sub", "id": 9, "topic": "t", "weight": 0}, "bad_request", True),
    ("ack-unknown-sub", {"op": "ack", "id": 9, "sub": 999, "codes": []}, "bad_subscription", True),
    ("ack-sub-string", {"op": "ack", "id": 9, "sub": "1", "codes": []}, "bad_subscription", True),
    ("ack-sub-missing", {"op": "ack", "id": 9, "codes": []}, "bad_subscription", True),
    ("unsub-unknown", {"op": "unsub", "id": 9, "sub": 999}, "bad_subscription", True),
    ("touch-unknown-sub", {"op": "touch", "id": 9, "sub": 999, "codes": ["a"]}, "bad_subscription", True),
    ("credit-unknown-sub", {"op": "credit", "id": 9, "sub": 999, "prefetch": 5}, "bad_subscription", True),
    ("credit-zero", {"op": "credit", "id": 9, "sub": SUB, "prefetch": 0}, "bad_request", True),
    ("credit-missing", {"op": "credit", "id": 9, "sub": SUB}, "bad_request", True),
    ("codes-not-list", {"op": "ack", "id": 9, "sub": SUB, "codes": "abc"}, "bad_request", True),
    ("codes-ints", {"op": "ack", "id": 9, "sub": SUB, "codes": [1, 2]}, "bad_request", True),
    ("nack-requeue-string", {"op": "nack", "id": 9, "sub": SUB, "codes": [], "requeue": "yes"},
     "bad_request", True),
    ("unknown-code", {"op": "ack", "id": 9, "sub": SUB, "codes": ["0" * 32]}, "unknown_code", True),
]  # fmt: skip


def _fill(frame: Any, sub: int) -> Any:
    if isinstance(frame, dict):
        return {k: sub if v is SUB else v for k, v in frame.items()}
    return frame


@pytest.mark.parametrize(
    ("frame", "code", "echo"),
    [pytest.param(*c[1:], id=c[0]) for c in BAD_FRAMES],
)
async def test_bad_ws_frame(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str], frame: Any, code: str, echo: bool
) -> None:
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        await ws.send_str(json.dumps({"op": "sub", "id": "setup", "topic": "setup"}))
        sub = (await reply(ws, "setup"))["sub"]
        frame = _fill(frame, sub)
        await ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))
        err = await read_frame(ws)
        assert err["op"] == "error", err
        assert err["code"] == code, err
        assert isinstance(err["message"], str) and len(err["message"]) > 5
        assert err["id"] == (9 if echo else None)
        await still_serving(node, session, auth, ws)
    # Nothing was stored by a refused publish.
    assert await pull_all(node, session, auth, "t") == []


async def test_bad_binary_frame(node: Any, session: aiohttp.ClientSession, auth: dict[str, str]) -> None:
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        await ws.send_bytes(b"\xff\xfe\x00garbage")
        err = await read_frame(ws)
        assert err["op"] == "error" and err["code"] == "bad_request"
        await still_serving(node, session, auth, ws)


async def test_many_errors_in_a_row_keep_the_connection(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        for i in range(200):
            await ws.send_str(json.dumps({"op": "nope", "id": i}))
        for i in range(200):
            err = await read_frame(ws)
            assert err == {"op": "error", "id": i, "code": "unknown_op", "message": err["message"]}
        await still_serving(node, session, auth, ws)


async def test_oversize_message_ws(
    make_node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    node = await make_node("mq.max_message_bytes=1000")
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        await ws.send_str(json.dumps({"op": "pub", "id": 1, "topic": "t", "msgs": [{"data": "x" * 1000}]}))
        assert (await reply(ws, 1))["op"] == "puback"  # exactly the limit is fine
        # One oversize message refuses the whole batch.
        msgs = [{"data": "ok"}, {"data": "x" * 1001}]
        await ws.send_str(json.dumps({"op": "pub", "id": 2, "topic": "t", "msgs": msgs}))
        err = await reply(ws, 2)
        assert err["op"] == "error" and err["code"] == "message_too_large"
        assert "1001" in err["message"] and "max_message_bytes" in err["message"]
        await still_serving(node, session, auth, ws)
    assert [m["data"] for m in await pull_all(node, session, auth, "t")] == ["x" * 1000]


async def test_oversize_message_http(
    make_node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    node = await make_node("mq.max_message_bytes=1000")
    async with session.post(
        f"{node.url}/v1/topics/t/messages", json={"data": "x" * 1001}, headers=auth
    ) as resp:
        assert resp.status == 413
        body = await resp.json()
    assert body["error"] == "message_too_large" and "max_message_bytes" in body["message"]
    await still_serving(node, session, auth, None)
    assert await pull_all(node, session, auth, "t") == []


async def raw_upgrade(
    port: int, path: str, auth: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket upgrade on a raw socket (to send frames no client library would)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: {auth['Authorization']}\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), scaled(5))
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


def _masked_frame_head(opcode: int, declared_len: int, payload: bytes) -> bytes:
    """A client frame (FIN set, masked) that declares ``declared_len`` bytes but carries ``payload``."""
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | 127]) + declared_len.to_bytes(8, "big") + mask + body


async def test_frame_beyond_websocket_limit_closes_1009(
    make_node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    node = await make_node("mq.max_message_bytes=1000", "server.max_batch=1")
    port = node.server.port
    # A raw socket: the frame header announces 9 MB (over the ~8.4 MB limit), and the
    # server must refuse it from the header alone, with close code 1009.
    reader, writer = await raw_upgrade(port, "/v1/ws", auth)
    try:
        writer.write(_masked_frame_head(0x1, 9_000_000, b'{"op": "pub", "msgs": [{"data": "xxxx'))
        await writer.drain()
        first = await asyncio.wait_for(reader.readexactly(2), scaled(5))
        assert first[0] == 0x88, first  # FIN + close
        payload = await asyncio.wait_for(reader.readexactly(first[1] & 0x7F), scaled(5))
        assert int.from_bytes(payload[:2], "big") == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        assert b"Traceback" not in payload
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    await still_serving(node, session, auth, None)

    async def cleaned_up() -> bool:
        async with session.get(node.url + "/health") as resp:
            return bool((await resp.json())["clients"] == 0)

    await eventually(cleaned_up, what="the refused connection cleaned up")
    assert await pull_all(node, session, auth, "t") == []


@pytest.mark.parametrize("route", ["/v1/ws", "/Producers/Conn/t/p1"])
async def test_unmasked_client_frame_closes_1002(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str], route: str
) -> None:
    """RFC 6455 §5.1: the server closes the connection on an unmasked client frame
    (/v1/ws once took them)."""
    port = node.server.port
    reader, writer = await raw_upgrade(port, route, auth)
    try:
        frame = b'{"op": "ping", "id": 1}'
        writer.write(bytes([0x81, len(frame)]) + frame)  # FIN + text, no mask bit
        await writer.drain()
        seen = b""
        while True:  # a KapokMQ route first prompts for the key
            first = await asyncio.wait_for(reader.readexactly(2), scaled(5))
            payload = await asyncio.wait_for(reader.readexactly(first[1] & 0x7F), scaled(5))
            seen += payload
            if first[0] == 0x88:  # FIN + close
                break
        assert int.from_bytes(payload[:2], "big") == aiohttp.WSCloseCode.PROTOCOL_ERROR, payload
        assert b"pong" not in seen  # the frame was never taken
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    await still_serving(node, session, auth, None)


@pytest.mark.parametrize(
    ("violation", "code"),
    [
        (client_frame(0x1, b'{"op": "ping", "id": "\xff"}'), 1007),
        (client_frame(0x9, b"x", fin=False), 1002),
        (client_frame(0x8, (1005).to_bytes(2, "big")), 1002),
        (client_frame(0x0, b"orphan"), 1002),
        (client_frame(0x1, b"{}", rsv=4), 1002),
        (client_frame(0x3, b"{}"), 1002),
    ],
    ids=["invalid-utf8", "fragmented-ping", "reserved-close-code", "orphan-continuation", "rsv", "opcode"],
)
async def test_violations_on_v1_ws_close_with_their_code_after_earlier_frames(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str], violation: bytes, code: int
) -> None:
    """/v1/ws refuses what the KapokMQ routes refuse, with the same codes, and answers the
    frames before the violation first (never one after it)."""
    reader, writer = await raw_upgrade(node.server.port, "/v1/ws", auth)
    try:
        ping = client_frame(0x1, b'{"op": "ping", "id": 1}')
        writer.write(ping + violation + client_frame(0x1, b'{"op": "ping", "id": 2}'))
        frames = []
        while True:
            first = await asyncio.wait_for(reader.readexactly(2), scaled(5))
            payload = await asyncio.wait_for(reader.readexactly(first[1] & 0x7F), scaled(5))
            if first[0] == 0x88:
                break
            frames.append(orjson.loads(payload))
        assert int.from_bytes(payload[:2], "big") == code, payload
        assert frames == [{"op": "pong", "id": 1}]
        assert await asyncio.wait_for(reader.read(), scaled(5)) == b""  # then the node hangs up
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    await still_serving(node, session, auth, None)


async def test_big_frame_from_a_real_client_is_refused(
    make_node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    node = await make_node("mq.max_message_bytes=1000", "server.max_batch=1")
    async with session.ws_connect(node.ws_url + "/v1/ws", headers=auth) as ws:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):
            await ws.send_str(
                json.dumps({"op": "pub", "id": 1, "topic": "t", "msgs": [{"data": "x" * 9_000_000}]})
            )
        msg = await ws.receive(timeout=scaled(10))
        # The close frame (1009) may be lost to the reset of a half-sent frame; either way
        # the connection ends without a reply.
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR), msg
        if msg.type is aiohttp.WSMsgType.CLOSE:
            assert msg.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    await still_serving(node, session, auth, None)
    assert await pull_all(node, session, auth, "t") == []


# ---------------------------------------------------------------- HTTP


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, status: int, error: str, **kw: Any
) -> dict[str, Any]:
    async with session.request(method, url, **kw) as resp:
        text = await resp.text()
        assert "Traceback" not in text
        assert resp.status == status, (resp.status, text)
        assert resp.content_type == "application/json", text
        body: dict[str, Any] = json.loads(text)
    assert body["error"] == error, body
    assert isinstance(body["message"], str) and body["message"]
    return body


BAD_HTTP: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    # (case id, method, path, request kwargs, status, error code)
    ("invalid-json", "POST", "/v1/topics/t/messages", {"data": b"{bad json"}, 400, "bad_request"),
    ("empty-body", "POST", "/v1/topics/t/messages", {"data": b""}, 400, "bad_request"),
    ("json-array", "POST", "/v1/topics/t/messages", {"json": [1, 2]}, 400, "bad_request"),
    ("data-number", "POST", "/v1/topics/t/messages", {"json": {"data": 1}}, 400, "bad_request"),
    ("priority-string", "POST", "/v1/topics/t/messages", {"json": {"data": "x", "priority": "high"}},
     400, "bad_request"),
    ("messages-not-list", "POST", "/v1/topics/t/messages", {"json": {"messages": "x"}}, 400, "bad_request"),
    ("messages-item-number", "POST", "/v1/topics/t/messages", {"json": {"messages": [1]}},
     400, "bad_request"),
    ("messages-item-null", "POST", "/v1/topics/t/messages", {"json": {"messages": [None]}},
     400, "bad_request"),
    ("messages-empty", "POST", "/v1/topics/t/messages", {"json": {"messages": []}}, 400, "bad_request"),
    ("bad-base64", "POST", "/v1/topics/t/messages", {"json": {"data": "***", "enc": "base64"}},
     400, "bad_request"),
    ("topic-space", "POST", "/v1/topics/a%20b/messages", {"json": {"data": "x"}}, 400, "bad_request"),
    ("topic-slash", "POST", "/v1/topics/a%2Fb/messages", {"json": {"data": "x"}}, 400, "bad_request"),
    ("max-abc", "GET", "/v1/topics/t/messages?max=abc", {}, 400, "bad_request"),
    ("max-zero", "GET", "/v1/topics/t/messages?max=0", {}, 400, "bad_request"),
    ("max-huge", "GET", "/v1/topics/t/messages?max=100000", {}, 400, "bad_request"),
    ("wait-negative", "GET", "/v1/topics/t/messages?wait=-1", {}, 400, "bad_request"),
    ("wait-nan", "GET", "/v1/topics/t/messages?wait=nan", {}, 400, "bad_request"),
    ("wait-too-long", "GET", "/v1/topics/t/messages?wait=100000", {}, 400, "bad_request"),
    ("lease-zero", "GET", "/v1/topics/t/messages?lease_s=0", {}, 400, "bad_request"),
    ("reserved-group", "GET", "/v1/topics/t/messages?group=~x", {}, 400, "bad_subscription"),
    ("ack-codes-not-list", "POST", "/v1/topics/t/ack", {"json": {"codes": "abc"}}, 400, "bad_request"),
    ("ack-invalid-json", "POST", "/v1/topics/t/ack", {"data": b"nope"}, 400, "bad_request"),
    ("ack-group-number", "POST", "/v1/topics/t/ack", {"json": {"group": 1, "codes": []}}, 400, "bad_request"),
    ("nack-requeue-string", "POST", "/v1/topics/t/nack", {"json": {"codes": [], "requeue": "no"}},
     400, "bad_request"),
    ("wrong-method", "PUT", "/v1/topics/t/messages", {}, 405, "method_not_allowed"),
    ("wrong-method-topic", "DELETE", "/v1/topics/t", {}, 405, "method_not_allowed"),
    ("unknown-v1-route", "GET", "/v1/nope", {}, 404, "not_found"),
    ("unknown-route", "GET", "/no/such/page", {}, 404, "not_found"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "kw", "status", "error"), [c[1:] for c in BAD_HTTP], ids=[c[0] for c in BAD_HTTP]
)
async def test_bad_http_request(
    node: Any,
    session: aiohttp.ClientSession,
    auth: dict[str, str],
    method: str,
    path: str,
    kw: dict[str, Any],
    status: int,
    error: str,
) -> None:
    await _call(session, method, node.url + path, status, error, headers=auth, **kw)
    await still_serving(node, session, auth, None)
    assert await pull_all(node, session, auth, "t") == []  # nothing was stored


async def test_wrong_method_lists_the_allowed_ones(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    async with session.put(f"{node.url}/v1/topics/t/messages", headers=auth) as resp:
        assert resp.status == 405
        assert {"GET", "POST"} <= set(resp.headers["Allow"].split(","))


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "test", "Bearer "])
async def test_missing_or_wrong_bearer_is_401(
    node: Any, session: aiohttp.ClientSession, auth: dict[str, str], authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    for method, path in (("POST", "/v1/topics/t/messages"), ("GET", "/v1/topics"), ("GET", "/v1/nope")):
        await _call(
            session, method, node.url + path, 401, "unauthorized", headers=headers, json={"data": "x"}
        )
    await still_serving(node, session, auth, None)


async def test_body_beyond_the_request_limit(
    make_node: Any, session: aiohttp.ClientSession, auth: dict[str, str]
) -> None:
    node = await make_node("mq.max_message_bytes=1000", "server.max_batch=1")
    cfg = node.service.config
    limit = frame_limit(cfg.mq.max_message_bytes, cfg.server.max_batch)  # ~8.4 MB
    # One byte over the limit, with its Content-Length: the node answers from the headers,
    # before the body (the client asks first, with Expect: 100-continue, so that it reads the
    # answer instead of writing into a socket the node has closed).
    padding = limit + 1 - len(json.dumps({"data": ""}))
    body = json.dumps({"data": "x" * padding}).encode()
    assert len(body) == limit + 1
    headers = {**auth, "Content-Type": "application/json", "Content-Length": str(len(body))}
    async with session.post(
        f"{node.url}/v1/topics/t/messages", data=io.BytesIO(body), headers=headers, expect100=True
    ) as resp:
        assert resp.status == 413, await resp.text()
        assert resp.content_type == "application/json"
        answer = await resp.json()
    assert answer["error"] == "message_too_large"
    assert isinstance(answer["message"], str) and answer["message"]
    await still_serving(node, session, auth, None)
    assert await pull_all(node, session, auth, "t") == []
