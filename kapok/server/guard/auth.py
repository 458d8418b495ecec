"""Secret-key checks for every data-bearing route (constant-time comparisons).

Every way of presenting the key goes through ``judge_key``: it compares the key and
asks the node's ``AuthThrottle`` what to answer (see there). ``check_key`` does the
waiting for HTTP routes: a wrong key's ``False`` comes only after its delay, and an
address whose back-off slots are all held gets ``AuthBlockedError`` (429) at once. The
throttle runs on the event loop's clock, like the sleeps that deliver its late answers.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Protocol

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from kapok.errors import AuthBlockedError
from kapok.protocol.kapokmq import ASK_KEY, KEY_ERROR, KEY_OK
from kapok.server.guard.connections import closing, set_state, trust
from kapok.server.guard.conntable import ConnState
from kapok.server.guard.throttle import Accept, Blocked, Reject, Verdict
from kapok.server.keys import CLIENTS, SERVICE

__all__ = [
    "bearer_token",
    "blocked_error",
    "check_key",
    "compat_handshake",
    "judge_key",
    "key_matches",
]

log = logging.getLogger("kapok.server")


def key_matches(given: str | None, secret: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), secret.encode())


def bearer_token(request: web.Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def judge_key(request: web.Request, given: str | None) -> Verdict:
    """Compare ``given`` with the secret key and ask the throttle what to answer; a right
    key makes the connection trusted (``kapok.server.guard.connections.trust``), a wrong one counts."""
    service = request.app[SERVICE]
    right = key_matches(given, service.config.mq.secret_key)  # every key, constant time
    now = asyncio.get_running_loop().time()
    clients = request.app[CLIENTS]
    verdict = clients.auth_throttle.judge(request.remote or "", given, right, now)
    if isinstance(verdict, Accept):
        trust(request)
    elif isinstance(verdict, Reject):
        clients.auth_failures += 1
    return verdict


def blocked_error(request: web.Request, verdict: Blocked) -> AuthBlockedError:
    wait = verdict.retry_after_s
    return AuthBlockedError(
        f"too many wrong secret keys from {request.remote}; try again in {wait:.0f} s", retry_after_s=wait
    )


async def check_key(request: web.Request, given: str | None) -> bool:
    """Is ``given`` the secret key? A right key answers at once; a wrong one after the
    address's back-off; raises ``AuthBlockedError`` when the address may not try now."""
    verdict = judge_key(request, given)
    if isinstance(verdict, Blocked):
        raise blocked_error(request, verdict)
    if isinstance(verdict, Reject):
        if verdict.delay_s > 0:
            await asyncio.sleep(verdict.delay_s)  # one of the address's few held slots
        return False
    return True


class KeyExchange(Protocol):
    """What the in-band key exchange needs of a socket (the node's ``ServerSocket``)."""

    async def send_str(self, data: str) -> None: ...

    async def receive(self, timeout: float | None = None) -> WSMessage: ...

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool: ...


async def _refuse(ws: KeyExchange, reason: str) -> bool:
    await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=reason.encode()[:120])
    return False


async def compat_handshake(ws: KeyExchange, request: web.Request) -> bool:
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
            request.app[CLIENTS].auth_failures += 1
            closing(request, "handshake_timeout")
            return await _refuse(ws, "authentication timed out")
        if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return False
        verdict = judge_key(request, msg.data if msg.type is WSMsgType.TEXT else None)
        if isinstance(verdict, Blocked):
            await ws.send_str(KEY_ERROR)
            return await _refuse(ws, blocked_error(request, verdict).message)
        if isinstance(verdict, Accept):
            set_state(request, ConnState.OPEN)
            await ws.send_str(KEY_OK)
            return True
        # A late answer, but never later than the handshake may last (the guard's deadline).
        delay = min(verdict.delay_s, give_up - loop.time())
        if delay > 0:
            await asyncio.sleep(delay)
        failures += 1
        await ws.send_str(KEY_ERROR)
        if failures >= cfg.server.auth_max_attempts:
            log.warning("closing a connection from %s after %d wrong secret keys", request.remote, failures)
            return await _refuse(ws, "too many wrong secret keys")
