"""``kapok serve``: run one node until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
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


async def _serve(config: Config) -> None:
    app = make_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.server.host, config.server.port, backlog=1024)
        await site.start()
        service = app[SERVICE]
        addresses = runner.addresses
        if addresses:
            service.http_port = int(addresses[0][1])
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
        sys.stdout.flush()
