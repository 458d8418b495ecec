"""TLS (``server.tls_cert`` / ``server.tls_key``): a real ``kapok serve`` with a certificate
made for the test by a throwaway CA; HTTPS requests and WSS sessions of both protocols."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest
import trustme

from kapok.launch import NodeProcess, start_node
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e]

AUTH = {"Authorization": "Bearer test"}
REPLY_S = scaled(5.0)  # how long the node may take to answer


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA) -> Iterator[NodeProcess]:
    base = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    key, chain = base / "key.pem", base / "cert.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    node = start_node(base / "node", f"server.tls_cert={chain}", f"server.tls_key={key}")
    try:
        yield node
    finally:
        node.stop()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def test_the_node_says_https_and_answers_over_tls(tls_node: NodeProcess, ca: trustme.CA) -> None:
    assert tls_node.url.startswith("https://127.0.0.1:")
    with urllib.request.urlopen(
        tls_node.url + "/health", context=client_context(ca), timeout=REPLY_S
    ) as resp:
        assert json.loads(resp.read())["status"] == "ok"
    # A client that does not trust the certificate is refused by its own TLS check.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(tls_node.url + "/health", context=ssl.create_default_context(), timeout=5)
    # Plain HTTP to the TLS port gets no HTTP answer.
    plain = "http" + tls_node.url.removeprefix("https")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain + "/health", timeout=5)


async def test_wss_sessions_of_both_protocols(tls_node: NodeProcess, ca: trustme.CA) -> None:
    context = client_context(ca)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(tls_node.ws_url + "/v1/ws", headers=AUTH, ssl=context) as ws:
            assert tls_node.ws_url.startswith("wss://")
            await ws.send_json({"op": "sub", "id": 1, "topic": "secure"})
            assert (await ws.receive_json(timeout=REPLY_S))["op"] == "subok"
            await ws.send_json({"op": "pub", "id": 2, "topic": "secure", "msgs": [{"data": "over tls"}]})
            seen: dict[str, dict[str, object]] = {}
            for _ in range(4):
                frame = await ws.receive_json(timeout=REPLY_S)
                seen[str(frame["op"])] = frame
                if "msg" in seen and "puback" in seen:
                    break
            assert seen["msg"]["msgs"][0]["data"] == "over tls"  # type: ignore[index]
        url = tls_node.ws_url + "/Producers/Conn/secure/p1"
        async with session.ws_connect(url, ssl=context) as ws:
            assert (await ws.receive(timeout=REPLY_S)).data == "Please enter the secret key"
            await ws.send_str("test")
            assert (await ws.receive(timeout=REPLY_S)).data == "Secret key matching succeeded"
            await ws.send_str(json.dumps({"MessageData": "kapokmq over tls", "DelayTime": 0}))
            assert (await asyncio.wait_for(ws.receive(), REPLY_S)).data == "ok"
        async with session.get(tls_node.url + "/v1/topics/secure", headers=AUTH, ssl=context) as resp:
            assert (await resp.json())["live"] == 2
