"""KapokMQ-compatible HTTP routes over real sockets: POST /Producer/Send, the
/Console/* JSON API and Serena's POST /Registry/GetNodes (reference §1.5, §6, §8)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kapok.testing import ManualClock, eventually
from kapok.testing.slow import scaled

SECRET = "test"
KEY_ERROR = "Secret key matching error"
T = scaled(5.0)  # upper bound of every single wait
CODE_RE = re.compile(r"[0-9a-f]{32}")
MESSAGE_KEYS = {"MessageCode", "MessageData", "Topic", "CreateTime", "ConsumedTime", "DelayTime", "Status"}
CONFIG_KEYS = {
    "pushType", "messageChanBuffer", "pushMessagesSpeed", "pushCount", "pushRetryTime",
    "persistentFile", "isPersistent", "recoveryStrategy", "persistentTime", "isCleanConsumed",
    "isRePush", "isClean", "checkSpeed", "cleanTime", "isCluster", "gossipPort", "registryAddr",
    "registryGossipPort", "isSync", "isSlave", "masterProtocol", "masterAddr", "masterPort",
}  # fmt: skip
CONSOLE_ROUTES = [
    "/Console/Ping",
    "/Console/GetClients",
    "/Console/GetConfig",
    "/Console/GetMessageList",
    "/Console/GetMessage",
    "/Console/DelMessage",
    "/Console/CountMessage",
    "/Console/GetNodes",
    "/Registry/GetNodes",
    "/Producer/Send",
]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def post(
    session: aiohttp.ClientSession,
    node: Any,
    path: str,
    data: Any = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST and return the parsed JSON body; KapokMQ always answers HTTP 200."""
    hdrs = {"secretKey": SECRET} if headers is None else headers
    async with session.post(node.url + path, data=data, headers=hdrs) as resp:
        assert resp.status == 200, await resp.text()
        return json.loads(await resp.read())


async def console(session: aiohttp.ClientSession, node: Any, name: str, **form: str) -> Any:
    return await post(session, node, "/Console/" + name, data=form)


async def send(
    session: aiohttp.ClientSession, node: Any, data: str, topic: str = "jobs", delay: str = "0"
) -> str:
    body = await post(
        session, node, "/Producer/Send", {"messageData": data, "topic": topic, "delayTime": delay}
    )
    assert set(body) == {"code", "msg"} and body["code"] == 0, body
    assert CODE_RE.fullmatch(body["msg"]), body
    return str(body["msg"])


def fmt(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


async def ws_handshake(ws: aiohttp.ClientWebSocketResponse) -> None:
    assert await ws.receive_str(timeout=T) == "Please enter the secret key"
    await ws.send_str(SECRET)
    assert await ws.receive_str(timeout=T) == "Secret key matching succeeded"


# ---------------------------------------------------------------- POST /Producer/Send


async def test_send_urlencoded(node: Any, session: aiohttp.ClientSession) -> None:
    form = {"messageData": '{"a": 1}', "topic": "jobs", "delayTime": "0"}
    async with session.post(node.url + "/Producer/Send", data=form, headers={"secretKey": SECRET}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        body = await resp.json()
    assert set(body) == {"code", "msg"} and body["code"] == 0
    code = body["msg"]
    assert CODE_RE.fullmatch(code)
    got = await console(session, node, "GetMessage", messageCode=code)
    assert got["code"] == 0
    assert set(got["data"]) == MESSAGE_KEYS
    assert got["data"]["MessageData"] == '{"a": 1}'
    assert got["data"]["Topic"] == "jobs"
    assert got["data"]["Status"] == -1 and got["data"]["DelayTime"] == 0


async def test_send_multipart(node: Any, session: aiohttp.ClientSession) -> None:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("messageData", "from multipart")
    form.add_field("topic", "jobs")
    form.add_field("delayTime", "45")
    body = await post(session, node, "/Producer/Send", form)
    assert body["code"] == 0 and CODE_RE.fullmatch(body["msg"])
    got = (await console(session, node, "GetMessage", messageCode=body["msg"]))["data"]
    assert got["MessageData"] == "from multipart" and got["Topic"] == "jobs"
    assert got["DelayTime"] == 45 and got["Status"] == 0


async def test_send_codes_are_unique(node: Any, session: aiohttp.ClientSession) -> None:
    codes = [await send(session, node, "same") for _ in range(5)]
    assert len(set(codes)) == 5


async def test_send_is_delivered_to_ws_consumer(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as ws:
        await ws_handshake(ws)
        code = await send(session, node, "over http")
        push = json.loads(await ws.receive_str(timeout=T))
        assert push["MessageCode"] == code and push["MessageData"] == "over http"
        await ws.send_str(code)

        async def consumed() -> bool:
            return bool((await console(session, node, "GetMessage", messageCode=code))["data"]["Status"] == 1)

        await eventually(consumed, what="the ack applied")


@pytest.mark.parametrize("headers", [{}, {"secretKey": "wrong"}, {"secretKey": ""}, {"secretkey": "tes"}])
async def test_send_bad_key(node: Any, session: aiohttp.ClientSession, headers: dict[str, str]) -> None:
    form = {"messageData": "x", "topic": "jobs", "delayTime": "0"}
    assert await post(session, node, "/Producer/Send", form, headers) == {"code": -1, "msg": KEY_ERROR}
    assert (await console(session, node, "CountMessage"))["data"]["all"] == 0


@pytest.mark.parametrize(
    "form",
    [
        {"messageData": "", "topic": "jobs", "delayTime": "0"},
        {"messageData": "x", "topic": "", "delayTime": "0"},
        {"topic": "jobs", "delayTime": "0"},
        {"messageData": "x", "delayTime": "0"},
        {},
    ],
)
async def test_send_required_fields(node: Any, session: aiohttp.ClientSession, form: dict[str, str]) -> None:
    body = await post(session, node, "/Producer/Send", form)
    assert body == {"code": -1, "msg": "Required data cannot be empty"}
    assert (await console(session, node, "CountMessage"))["data"]["all"] == 0


@pytest.mark.parametrize(
    "delay",
    [
        "",
        "abc",
        "1.5",
        "0x10",
        "1e3",
        "99999999999999999999999999",
        "-99999999999999999999999999",
    ],
)
async def test_send_bad_delay_is_readable(node: Any, session: aiohttp.ClientSession, delay: str) -> None:
    body = await post(
        session, node, "/Producer/Send", {"messageData": "x", "topic": "jobs", "delayTime": delay}
    )
    assert set(body) == {"code", "msg"} and body["code"] == -1
    msg = body["msg"]
    assert isinstance(msg, str) and msg  # KapokMQ bug 22: a serialized Go error object
    assert "delay" in msg.lower()
    assert not msg.lstrip().startswith(("{", "[")) and "Traceback" not in msg
    assert (await console(session, node, "CountMessage"))["data"]["all"] == 0


# ---------------------------------------------------------------- console


async def test_every_route_needs_the_key(make_node: Any, session: aiohttp.ClientSession) -> None:
    node = await make_node("server.auth_backoff_after=1000")  # many wrong keys, one address
    for path in CONSOLE_ROUTES:
        for headers in ({}, {"secretKey": "nope"}, {"Authorization": f"Bearer {SECRET}"}):
            body = await post(session, node, path, {}, headers)
            assert body == {"code": -1, "msg": KEY_ERROR}, (path, headers, body)


async def test_ping(node: Any, session: aiohttp.ClientSession) -> None:
    assert await console(session, node, "Ping") == {"code": 0}


async def test_get_clients(make_node: Any, session: aiohttp.ClientSession, clock: ManualClock) -> None:
    node = await make_node(clock=clock)
    async with (
        session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/cons-1") as cons,
        session.ws_connect(f"{node.ws_url}/Producers/Conn/other/prod-1") as prod,
    ):
        await ws_handshake(cons)
        await ws_handshake(prod)

        async def both_listed() -> Any:
            body = await console(session, node, "GetClients")
            return body if body["consumers"] and body["producers"] else None

        body = await eventually(both_listed, what="the consumer and the producer listed")
        assert set(body) == {"code", "consumers", "producers"} and body["code"] == 0
        now = int(clock.now)
        (c,) = body["consumers"]
        assert set(c) == {"ConsumerId", "Topic", "ConsumerIp", "JoinTime"}
        assert (c["ConsumerId"], c["Topic"], c["ConsumerIp"]) == ("cons-1", "jobs", "127.0.0.1")
        assert type(c["JoinTime"]) is int and c["JoinTime"] == now
        (p,) = body["producers"]
        assert set(p) == {"ProducerId", "Topic", "ProducerIp", "JoinTime"}
        assert (p["ProducerId"], p["Topic"], p["ProducerIp"]) == ("prod-1", "other", "127.0.0.1")
        assert type(p["JoinTime"]) is int and p["JoinTime"] == now


async def test_get_clients_lists_native_connections_by_what_they_do(
    node: Any, session: aiohttp.ClientSession
) -> None:
    auth = {"Authorization": f"Bearer {SECRET}"}
    async with (
        session.ws_connect(f"{node.ws_url}/v1/ws?client=worker", headers=auth) as ws,
        session.ws_connect(f"{node.ws_url}/v1/ws?client=idle", headers=auth),
    ):
        msgs = [{"topic": "a", "data": "1"}, {"topic": "b", "data": "2"}]
        await ws.send_json({"op": "pub", "id": 1, "msgs": msgs})
        assert (await ws.receive_json(timeout=T))["op"] == "puback"
        await ws.send_json({"op": "sub", "id": 2, "topic": "c"})
        subok = await ws.receive_json(timeout=T)
        assert subok["op"] == "subok"
        body = await console(session, node, "GetClients")
        producers = [(p["ProducerId"], p["Topic"]) for p in body["producers"]]
        assert producers == [("worker", "a"), ("worker", "b")]
        assert [(c["ConsumerId"], c["Topic"]) for c in body["consumers"]] == [("worker", "c")]
        await ws.send_json({"op": "unsub", "id": 3, "sub": subok["sub"]})
        assert (await ws.receive_json(timeout=T))["op"] == "ok"
        assert (await console(session, node, "GetClients"))["consumers"] == []


async def test_get_clients_excludes_unauthenticated(node: Any, session: aiohttp.ClientSession) -> None:
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as ws:
        assert await ws.receive_str(timeout=T) == "Please enter the secret key"
        body = await console(session, node, "GetClients")
        assert not body["consumers"] and not body["producers"]


async def test_get_config_has_kapokmq_keys(make_node: Any, session: aiohttp.ClientSession) -> None:
    node = await make_node("mq.push_type=2", "mq.ack_timeout_s=42")
    body = await console(session, node, "GetConfig")
    assert set(body) == {"code", "data"} and body["code"] == 0
    data = body["data"]
    assert set(data) == CONFIG_KEYS
    assert len(data) == 23
    assert data["pushType"] == 2
    assert data["pushRetryTime"] == 42
    assert isinstance(data["registryGossipPort"], str) and isinstance(data["masterPort"], str)
    assert isinstance(data["registryAddr"], str) and isinstance(data["masterAddr"], str)
    assert isinstance(data["persistentFile"], str) and isinstance(data["masterProtocol"], str)
    for key in CONFIG_KEYS - {"registryGossipPort", "masterPort", "registryAddr", "masterAddr",
                              "persistentFile", "masterProtocol"}:  # fmt: skip
        assert type(data[key]) is int, key
    assert SECRET not in data.values() and not any("secret" in k.lower() for k in data)


async def test_count_message(node: Any, session: aiohttp.ClientSession) -> None:
    empty = await console(session, node, "CountMessage")
    assert empty == {"code": 0, "data": {"all": 0, "consumed": 0, "delay": 0, "unconsumed": 0}}
    await send(session, node, "a")
    await send(session, node, "b")
    await send(session, node, "c", delay="100")
    body = await console(session, node, "CountMessage")
    assert body == {"code": 0, "data": {"all": 3, "consumed": 0, "delay": 1, "unconsumed": 2}}


async def _three_states(session: aiohttp.ClientSession, node: Any) -> dict[str, str]:
    """One pending, one delayed, one consumed message on topic jobs, plus one on topic other."""
    pending = await send(session, node, "pending")
    delayed = await send(session, node, "delayed", delay="300")
    other = await send(session, node, "other", topic="other")
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as ws:
        await ws_handshake(ws)
        push = json.loads(await ws.receive_str(timeout=T))
        assert push["MessageCode"] == pending
        await ws.send_str(pending)

        async def consumed() -> bool:
            return bool(
                (await console(session, node, "GetMessage", messageCode=pending))["data"]["Status"] == 1
            )

        await eventually(consumed, what="the ack applied")
    fresh = await send(session, node, "fresh")  # pending, newest
    return {"consumed": pending, "delayed": delayed, "other": other, "pending": fresh}


async def test_get_message_list_filters(node: Any, session: aiohttp.ClientSession) -> None:
    codes = await _three_states(session, node)
    now = time.time()
    window = {"startTime": fmt(now - 60), "endTime": fmt(now + 60)}

    async def listing(**form: str) -> list[dict[str, Any]]:
        body = await console(session, node, "GetMessageList", **window, **form)
        assert body["code"] == 0, body
        rows = body["data"] or []
        for row in rows:
            assert set(row) == MESSAGE_KEYS
            assert row["MessageData"] == ""  # blanked in lists, as in KapokMQ
        return list(rows)

    everything = await listing(status="3")
    assert [r["MessageCode"] for r in everything] == [
        codes["pending"],
        codes["other"],
        codes["delayed"],
        codes["consumed"],
    ]  # newest first
    assert [r["CreateTime"] for r in everything] == sorted(
        (r["CreateTime"] for r in everything), reverse=True
    )
    jobs = await listing(status="3", topic="jobs")
    assert {r["MessageCode"] for r in jobs} == {codes["pending"], codes["delayed"], codes["consumed"]}
    assert [r["MessageCode"] for r in await listing(status="-1", topic="jobs")] == [codes["pending"]]
    assert [r["MessageCode"] for r in await listing(status="0")] == [codes["delayed"]]
    (consumed,) = await listing(status="1")
    assert consumed["MessageCode"] == codes["consumed"]
    assert consumed["Status"] == 1 and consumed["ConsumedTime"] > 0
    assert {r["MessageCode"] for r in await listing(status="-1")} == {codes["pending"], codes["other"]}
    assert [r["MessageCode"] for r in await listing(status="3", topic="other")] == [codes["other"]]
    assert await listing(status="3", topic="nobody") == []
    # a window in the past matches nothing
    past = await console(
        session, node, "GetMessageList", startTime=fmt(now - 7200), endTime=fmt(now - 3600), status="3"
    )
    assert past["code"] == 0 and not past["data"]
    # the full message is still readable
    full = await console(session, node, "GetMessage", messageCode=codes["delayed"])
    assert full["code"] == 0 and full["data"]["MessageData"] == "delayed" and full["data"]["Status"] == 0


@pytest.mark.parametrize(
    "form",
    [
        {"startTime": "2022-2-5 00:00:00x", "endTime": "2099-01-01 00:00:00", "status": "3"},
        {"startTime": "yesterday", "endTime": "2099-01-01 00:00:00", "status": "3"},
        {"startTime": "2022-01-01 00:00:00", "endTime": "2099-13-01 00:00:00", "status": "3"},
        {"startTime": "2022-01-01 00:00:00", "endTime": "2099-01-01T00:00:00", "status": "3"},
    ],
)
async def test_get_message_list_bad_date(
    node: Any, session: aiohttp.ClientSession, form: dict[str, str]
) -> None:
    await send(session, node, "x")
    body = await console(session, node, "GetMessageList", **form)
    assert body["code"] == -1
    assert isinstance(body["msg"], str) and body["msg"]


async def test_get_message_unknown(node: Any, session: aiohttp.ClientSession) -> None:
    for code in ("0" * 32, "", "not-a-code"):
        body = await console(session, node, "GetMessage", messageCode=code)
        assert body["code"] == -1 and body["data"] == "error", body


async def test_del_message(node: Any, session: aiohttp.ClientSession) -> None:
    keep = await send(session, node, "keep")
    drop = await send(session, node, "drop")
    assert await console(session, node, "DelMessage", messageCode=drop) == {"code": 0}
    assert (await console(session, node, "GetMessage", messageCode=drop))["code"] == -1
    assert (await console(session, node, "GetMessage", messageCode=keep))["code"] == 0
    rows = (await console(session, node, "GetMessageList", status="3"))["data"]
    assert [r["MessageCode"] for r in rows] == [keep]
    assert (await console(session, node, "CountMessage"))["data"]["all"] == 1
    # and it is never delivered: the consumer sees only the kept one, then a marker sent
    # after it (a socket's frames leave in order: nothing came in between)
    async with session.ws_connect(f"{node.ws_url}/Consumers/Conn/jobs/c1") as ws:
        await ws_handshake(ws)
        assert json.loads(await ws.receive_str(timeout=T))["MessageCode"] == keep
        await ws.send_str(keep)
        marker = await send(session, node, "marker")
        assert json.loads(await ws.receive_str(timeout=T))["MessageCode"] == marker


async def test_registry_get_nodes(node: Any, session: aiohttp.ClientSession) -> None:
    port = node.server.port
    expected = [{"Name": f"mq:127.0.0.1:{port}", "Addr": "127.0.0.1", "Port": str(port)}]
    assert await post(session, node, "/Registry/GetNodes") == expected
    assert await console(session, node, "GetNodes") == expected
