"""``kapok serve``: run one node until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
from collections.abc import Callable

from aiohttp import web

from kapok.config import Config
from kapok.server.app import make_app
from kapok.server.keys import SERVICE

__all__ = ["serve"]

log = logging.getLogger("kapok")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(config: Config) -> None:
    """Blocking entry point of ``kapok serve``."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(config))


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound but not yet listening: with port 0 the node learns its
    real port before anything uses its name (``host:port``), so every node of a test
    cluster started on port 0 has a name of its own."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


async def _serve(config: Config) -> None:
    sock = _bind(config.server.host, config.server.port)
    if config.server.port == 0:
        config = dataclasses.replace(
            config, server=dataclasses.replace(config.server, port=int(sock.getsockname()[1]))
        )
    app = make_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    try:
        await runner.setup()
        site = web.SockSite(runner, sock, backlog=1024)
        await site.start()
        service = app[SERVICE]
        # Tests and scripts wait for this exact line (stdout), so keep its shape.
        print(f"kapok: node {service.node_name} listening on {service.http_url}", flush=True)
        log.info(
            "node %s listening on %s (push_type %d)", service.node_name, service.http_url, config.mq.push_type
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()
        sock.close()
        sys.stdout.flush()
