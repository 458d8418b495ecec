"""``kapok serve``: run one node until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import errno
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from aiohttp import web

from kapok.config import Config, is_loopback
from kapok.logs import set_node
from kapok.node.app import make_app, wind_down
from kapok.node.seams import Seams
from kapok.server.guard.connections import GUARD
from kapok.server.guard.listener import GuardedSite, tls_context
from kapok.server.keys import SERVICE

__all__ = ["serve"]

log = logging.getLogger("kapok")

_M_MMAP_THRESHOLD = -3  # glibc mallopt(3)
# Buffers at least this big get pages of their own, returned to the OS when freed.
MMAP_THRESHOLD = 128 * 1024
GC_THRESHOLD = 50_000  # the collector's generation-0 threshold (see _serve)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(config: Config, *, seams: Seams | None = None) -> None:
    """Blocking entry point of ``kapok serve`` (``seams``: parts other than the real ones,
    for the fault injector ``kapok.faulty``; None for a normal node)."""
    _fix_mmap_threshold()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(config, seams))


def _fix_mmap_threshold() -> None:
    """Keep large buffers (WAL batches, socket reads, joined frames) out of the heap.

    glibc raises its mmap threshold to the size of the largest mmapped block freed so
    far (up to 32 MiB): after one big WAL batch every later buffer below that size is
    carved from the heap, which fragments and is never given back, so the node's RSS
    stays at its peak (190 MB instead of 115 MB after the ``clients`` bench). Setting
    the threshold explicitly turns that adjustment off. Elsewhere this is a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound but not yet listening: with port 0 the node learns its
    real port before anything uses its name (``host:port``), so every node of a test
    cluster started on port 0 has a name of its own."""
    where = f"cannot listen on {host}:{port} (server.host, server.port)"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise _bind_error(exc, where) from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise _bind_error(exc, where) from exc
    except BaseException:
        sock.close()
        raise
    return sock


async def _set_up(runner: web.AppRunner, config: Config) -> None:
    """Start the app's parts; gossip binds its port here (``cluster.bind``)."""
    try:
        await runner.setup()
    except OSError as exc:
        if config.cluster.enabled and _errno(exc) in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise _bind_error(exc, f"cannot bind gossip to {config.cluster.bind} (cluster.bind)") from exc
        raise


def _errno(exc: OSError) -> int | None:
    """The error number, also of uvloop's bind errors, which carry it only in their cause."""
    cause = exc.__cause__
    return exc.errno if exc.errno is not None or not isinstance(cause, OSError) else cause.errno


def _bind_error(exc: OSError, what: str) -> OSError:
    """``exc`` as one line that names the address (``what``): a bind error of uvloop's says
    "Address already in use" and nothing else, or the address and not why."""
    number = _errno(exc)
    reason = os.strerror(number) if number is not None and number > 0 else exc.strerror or str(exc)
    return OSError(f"{what}: {reason}")


async def _serve(config: Config, seams: Seams | None = None) -> None:
    # The stop signals are caught from here on, not only once the node listens: a SIGTERM
    # during start-up (recovery, binding), or just after the "listening" line, would
    # otherwise meet Python's default action and end the node on the spot, with no snapshot
    # and the archiver left to finish alone. Such a signal lets the start-up finish and then
    # stops the node cleanly; a second one exits at once, as always.
    stop_signal = _stop_signals()
    sock = _bind(config.server.host, config.server.port)
    if config.server.port == 0:
        config = dataclasses.replace(
            config, server=dataclasses.replace(config.server, port=int(sock.getsockname()[1]))
        )
    set_node(config.server.node_name)  # the real port is known: every later line names the node
    _warn_plain_traffic(config)
    app = make_app(config, seams=seams)
    ssl_context = tls_context(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    # Start-up builds the state that lives as long as the node (recovery: a million queued
    # messages are some three million objects): the collector stays off until it is frozen
    # below, or each collection in between would walk all of it (0.3 s and 0.5 s pauses
    # that delayed the first /health by 0.8 s).
    gc.disable()
    try:
        await _set_up(runner, config)
        # Connections are counted and timed from accept (kapok.server.guard.connections).
        site = GuardedSite(runner, sock, app[GUARD], backlog=1024, ssl_context=ssl_context)
        await site.start()
        service = app[SERVICE]
        # Everything alive now (modules, the recovered state) lives as long as the node:
        # out of the collector's sight, a full collection scans only what came after, so
        # it pauses the loop for milliseconds instead of the ~100 ms that showed as the
        # latency bench's p99 and max. Frozen without a collection first: start-up leaves
        # no garbage cycles (a collection here freed none, in 0.5 s with a million queued).
        gc.freeze()
        gc.enable()
        # The collector counts tracked objects allocated minus freed. A broker's objects
        # die young by reference counting, except the messages that queue up: with the
        # default threshold (700) every few hundred queued messages cost a young
        # collection, and the growing backlog triggered full ones (300,000 publishes:
        # 1,800 + 160 + 9 collections, 1.6 s of a 5.5 s run, pauses up to 180 ms). At
        # 50,000 the same run collects 6 times (0.1 s, pauses up to 20 ms); garbage
        # cycles still go within 50,000 allocations.
        gc.set_threshold(GC_THRESHOLD)
        # Tests and scripts wait for this exact line (stdout), so keep its shape.
        print(f"kapok: node {service.node_name} listening on {service.http_url}", flush=True)
        log.info(
            "node %s listening on %s (push_type %d)", service.node_name, service.http_url, config.mq.push_type
        )
        signame = await stop_signal
        started = time.monotonic()
        log.info("%s received: shutting down (a second signal exits at once)", signame)
        await site.stop()
        log.info("stopped accepting connections on %s", service.http_url)
        # On a full disk, records that wait for space are given up (never acknowledged):
        # the requests and the hand-over below must not wait for space that may never come.
        service.store.stop_waiting()
        await wind_down(app)  # a master hands over; clients are closed with a reason
    finally:
        # Then the cleanup contexts, in reverse: gossip leaves, the store snapshots and
        # closes its WAL, the archiver finishes.
        await runner.cleanup()
        sock.close()
        sys.stdout.flush()
        gc.enable()  # a start-up that failed left it off
    log.info("stopped cleanly in %.3f s", time.monotonic() - started)


def _stop_signals() -> asyncio.Future[str]:
    """Catch SIGINT and SIGTERM: the first one sets the returned future (the signal's name),
    and from then on another one ends the process at once."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[str] = loop.create_future()

    def first(sig: signal.Signals) -> None:
        if not received.done():
            received.set_result(sig.name)
        for other in STOP_SIGNALS:
            loop.add_signal_handler(other, _exit_now, other)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, first, sig)
    return received


def _exit_now(sig: signal.Signals) -> None:
    """A second signal: the operator does not want to wait. Recovery copes with whatever
    the shutdown had not finished (that is its job after a crash, too)."""
    log.error("%s received during the shutdown: exiting at once, the shutdown is not finished", sig.name)
    logging.shutdown()  # flush the log line above
    sys.stdout.flush()
    os._exit(128 + sig.value)  # the shell's convention for "ended by this signal"


def _warn_plain_traffic(config: Config) -> None:
    """Without ``server.tls_cert``, off loopback, say once what travels in clear."""
    if not is_loopback(config.server.host) and not config.server.tls_cert:
        log.warning(
            "serving plain HTTP/WebSocket on %s: the secret key and the messages travel unencrypted; "
            "set server.tls_cert / server.tls_key, or keep the node on a private network or behind "
            "a TLS proxy or VPN", config.server.host,
        )  # fmt: skip
    cluster = config.cluster
    if cluster.enabled and not is_loopback(cluster.bind.rpartition(":")[0]):
        log.warning(
            "gossip on %s is signed (cluster.secret) but not encrypted: membership and addresses "
            "are readable on the network", cluster.bind,
        )  # fmt: skip
