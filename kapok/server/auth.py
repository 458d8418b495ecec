"""Secret-key checks for every data-bearing route (constant-time comparisons).

Every way of presenting the key goes through ``check_key``, which first asks the
node's ``AuthThrottle`` whether the address must wait (then the key is not even
compared: ``AuthBlockedError``), and records the outcome for it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from kapok.errors import AuthBlockedError
from kapok.server.conntable import ConnState
from kapok.server.guard import set_state, trust
from kapok.server.keys import SERVICE

__all__ = [
    "ASK_KEY",
    "KEY_ERROR",
    "KEY_OK",
    "bearer_token",
    "check_key",
    "compat_handshake",
    "key_matches",
]

log = logging.getLogger("kapok.server")

# The KapokMQ handshake strings, byte for byte.
ASK_KEY = "Please enter the secret key"
KEY_OK = "Secret key matching succeeded"
KEY_ERROR = "Secret key matching error"


def key_matches(given: str | None, secret: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def check_key(request: web.Request, given: str | None) -> bool:
    """Is ``given`` the secret key? Raises ``AuthBlockedError`` while the request's
    address must wait after too many wrong keys; counts a wrong key (metric and back-off);
    a right key makes the connection trusted (``kapok.server.guard.trust``)."""
    service = request.app[SERVICE]
    throttle = service.auth_throttle
    addr = request.remote or ""
    now = service.now()
    wait = throttle.wait_s(addr, now)
    if wait > 0:
        raise AuthBlockedError(
            f"too many wrong secret keys from {addr}; try again in {wait:.0f} s", retry_after_s=wait
        )
    if key_matches(given, service.config.mq.secret_key):
        throttle.succeeded(addr)
        trust(request)
        return True
    throttle.failed(addr, now)
    service.auth_failures += 1
    return False


async def _refuse(ws: web.WebSocketResponse, reason: str) -> bool:
    await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason.encode()[:120])
    return False


async def compat_handshake(ws: web.WebSocketResponse, request: web.Request) -> bool:
    """Run KapokMQ's in-band key exchange; unlike KapokMQ, with a limit on tries and time,
    and the node's per-address back-off."""
    service = request.app[SERVICE]
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
            return await _refuse(ws, "authentication timed out")
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return False
        try:
            ok = check_key(request, msg.data if msg.type is WSMsgType.TEXT else None)
        except AuthBlockedError as exc:
            await ws.send_str(KEY_ERROR)
            return await _refuse(ws, exc.message)
        if ok:
            set_state(request, ConnState.OPEN)
            await ws.send_str(KEY_OK)
            return True
        failures += 1
        await ws.send_str(KEY_ERROR)
        if failures >= cfg.server.auth_max_attempts:
            log.warning("closing a connection from %s after %d wrong secret keys", request.remote, failures)
            return await _refuse(ws, "too many wrong secret keys")
