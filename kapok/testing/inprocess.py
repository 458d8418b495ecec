"""A node running inside the test's own event loop, on a real socket."""

from __future__ import annotations

import dataclasses
import socket

from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.config import Config
from kapok.core.broker import Broker
from kapok.node.app import make_app
from kapok.replication.node import ReplicationNode
from kapok.server.keys import REPLICATION, SERVICE
from kapok.service import BrokerService

__all__ = ["InProcessNode", "RunningApp", "run_app"]


class InProcessNode:
    """A running app behind an aiohttp ``TestServer``: its service and base URLs."""

    def __init__(self, server: TestServer, app: web.Application) -> None:
        self.server = server
        self.app = app
        self.service: BrokerService = app[SERVICE]
        self.service.http_port = server.port or 0

    @property
    def broker(self) -> Broker:
        return self.service.broker

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"


class RunningApp:
    """A node's app served as ``kapok serve`` serves it: its port is known before the app
    starts (so its name and URL are right from the first moment), unlike a ``TestServer``."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket, config: Config) -> None:
        self.runner = runner
        self.sock = sock
        self.config = config
        self.app = runner.app
        self.service: BrokerService = self.app[SERVICE]
        self.stopped = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.server.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.config.server.port}"

    @property
    def broker(self) -> Broker:
        return self.service.broker

    @property
    def replication(self) -> ReplicationNode:
        return self.app[REPLICATION]

    async def stop(self) -> None:
        """Stop the node (a second call does nothing)."""
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()
            self.sock.close()


async def run_app(config: Config) -> RunningApp:
    """Bind 127.0.0.1 on a free port, then make and start the node's app on that socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = dataclasses.replace(
        config, server=dataclasses.replace(config.server, host="127.0.0.1", port=port)
    )
    runner = web.AppRunner(make_app(config), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        sock.close()
        raise
    return RunningApp(runner, sock, config)
