"""Secret-key checks for every data-bearing route (constant-time comparisons)."""

from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from kapok.server.service import BrokerService

__all__ = ["ASK_KEY", "KEY_ERROR", "KEY_OK", "bearer_ok", "compat_handshake", "key_matches"]

log = logging.getLogger("kapok.server")

# The KapokMQ handshake strings, byte for byte.
ASK_KEY = "Please enter the secret key"
KEY_OK = "Secret key matching succeeded"
KEY_ERROR = "Secret key matching error"


def key_matches(given: str | None, secret: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


def bearer_ok(request: web.Request, secret: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and key_matches(token.strip(), secret)


async def compat_handshake(ws: web.WebSocketResponse, service: BrokerService) -> bool:
    """Run KapokMQ's in-band key exchange; unlike KapokMQ, with a limit on tries and time."""
    cfg = service.config
    loop = asyncio.get_running_loop()
    give_up = loop.time() + cfg.server.auth_timeout_s
    failures = 0
    while True:
        await ws.send_str(ASK_KEY)
        try:
            msg = await ws.receive(timeout=max(give_up - loop.time(), 0.001))
        except TimeoutError:
            service.auth_failures += 1
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"authentication timed out")
            return False
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return False
        if msg.type is WSMsgType.TEXT and key_matches(msg.data, cfg.mq.secret_key):
            await ws.send_str(KEY_OK)
            return True
        failures += 1
        service.auth_failures += 1
        await ws.send_str(KEY_ERROR)
        if failures >= cfg.server.auth_max_attempts:
            log.warning("closing a connection after %d wrong secret keys", failures)
            await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"too many wrong secret keys")
            return False
