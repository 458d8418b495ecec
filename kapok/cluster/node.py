"""The asyncio driver of the SWIM core: a transport, the protocol's timer.

``GossipNode`` drives a ``Transport`` (``kapok.cluster.transport``: the real one is a UDP
socket and a TCP listener; a test or a fault injector may wrap it) and makes no protocol
decisions: bytes that arrive go to ``Swim.handle_packet`` (UDP) or ``Swim.handle_stream``
(TCP), ``Swim.tick`` runs when ``Swim.next_deadline()`` passes, and the effects that come
back are carried out — ``Send`` as one datagram, ``SendStream`` as one short TCP
connection carrying one length-prefixed blob, ``MemberChanged`` as a log line and a call
to each listener.

UDP and TCP share one port number (as in memberlist): with ``cluster.bind`` port 0 the
datagram socket picks a free port and the listener takes the same number (the transport
retries a few times if that TCP port is taken). The protocol clock is the event loop's
monotonic time.

Bad input never reaches further than a counter (and a bad HMAC a log line): the codec drops unauthenticated or
malformed packets (``Swim.stats["drop_<reason>"]``), and a stream that is too long, too
slow or cut off is closed and counted here (``stats``).

Two misconfigurations would otherwise be silent, so they are logged (on the loop's clock):

* a packet or stream whose HMAC does not verify comes from a peer with another
  ``cluster.secret``: a WARNING names the sender, at most once a minute per sender
  (``DropLog``). A datagram's sender is its gossip address; a stream comes from an
  ephemeral port, so its sender is its host (``"10.0.0.7 (TCP)"``). Such a peer never
  changes a row elsewhere: others list it only as they last heard it authentically —
  ``left`` if it was restarted gracefully with the new secret, ``dead`` if it crashed.
* a node with seeds that has heard from no peer ``seed_silence_s`` after start warns,
  naming the seeds, and again every ``SEED_WARNING_REPEAT_S`` until one answers; then
  one INFO line. (Only until the first join: once in, losing peers is what the member
  lines report.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import struct
from collections import Counter
from collections.abc import Callable

from kapok.cluster.codec import KeyRing
from kapok.cluster.config import SwimConfig
from kapok.cluster.droplog import DropLog
from kapok.cluster.messages import Effect, MemberChanged, NodeMeta, NodeState, Send, SendStream, State
from kapok.cluster.swim import Swim
from kapok.cluster.transport import Transport, UdpTcpTransport, format_addr, split_addr
from kapok.config import ClusterConfig
from kapok.errors import ConfigError
from kapok.tasks import cancel_all

__all__ = [
    "DROP_WARNING_INTERVAL_S",
    "SEED_SILENCE_S",
    "SEED_WARNING_REPEAT_S",
    "GossipNode",
    "format_addr",
    "split_addr",
    "swim_config",
]

log = logging.getLogger("kapok.cluster")

_LENGTH = struct.Struct(">I")
_MAX_STREAMS = 32  # concurrent outgoing (and, separately, incoming) state exchanges
_ADDR_CACHE_MAX = 4096
DROP_WARNING_INTERVAL_S = 60.0  # at most one bad-HMAC warning per sender this often
SEED_SILENCE_S = 30.0  # a node with seeds warns when none has answered this long after start
SEED_WARNING_REPEAT_S = 300.0  # and again this often while that lasts

Listener = Callable[[MemberChanged], None]


def swim_config(cluster: ClusterConfig) -> SwimConfig:
    """A node's protocol timings: its ``cluster.profile`` with the ``cluster.tuning``
    overrides applied; a combination that breaks a rule of ``SwimConfig`` is a ConfigError."""
    tuning = cluster.tuning
    overrides = {
        f.name: getattr(tuning, f.name)
        for f in dataclasses.fields(tuning)
        if getattr(tuning, f.name) is not None
    }
    try:
        return SwimConfig.profile(cluster.profile, **overrides)
    except ValueError as exc:
        raise ConfigError(f"cluster.tuning: {exc}") from None


class GossipNode:
    """One node's membership: start it, read ``members()``, close it (a graceful leave).

    ``transport`` defaults to the real network (``UdpTcpTransport``); one node, one transport.
    """

    def __init__(
        self,
        config: ClusterConfig,
        meta: NodeMeta,
        *,
        transport: Transport | None = None,
        rng: random.Random | None = None,
        seed_silence_s: float = SEED_SILENCE_S,
        drop_warning_interval_s: float = DROP_WARNING_INTERVAL_S,
    ) -> None:
        self.config = config
        self.swim_config = swim_config(config)
        self.meta = meta
        self.keyring = KeyRing(key.encode() for key in config.secret)
        self.rng = rng or random.Random()
        self.stats: Counter[str] = Counter()  # the driver's own counters; the protocol's are swim.stats
        self.addr = ""  # advertised host:port, known after start()
        self.swim: Swim | None = None
        self._listeners: list[Listener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.transport: Transport = transport if transport is not None else UdpTcpTransport()
        self._open = False  # the transport is started and not yet closed
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._streams_out: set[asyncio.Task[None]] = set()
        self._streams_in = 0
        self._resolved: dict[str, tuple[str, int]] = {}
        self._left = asyncio.Event()  # set once a leave notice has been spread enough
        # Long enough for a loaded peer, short enough that a dead one does not pile up tasks.
        self._stream_timeout_s = max(1.0, 10 * self.swim_config.probe_timeout_s)
        self._bad_hmacs = DropLog(drop_warning_interval_s)
        self._seed_silence_s = seed_silence_s
        self._seed_timer: asyncio.TimerHandle | None = None
        self._seed_warned = False
        self._started_at = 0.0
        self._joined = False  # a peer has been alive in our view (a seed answered, or one found us)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        host, port = split_addr(self.config.bind)
        bound = await self.transport.start(
            host, port, on_datagram=self._on_datagram, on_stream=self._on_stream, on_error=self._on_udp_error
        )
        self._open = True
        self.addr = self.config.advertise or format_addr(host, bound)
        self.swim = Swim(
            self.meta.name, self.addr, self.meta, self.swim_config, self.rng, keyring=self.keyring
        )
        seeds = ", ".join(self.config.seeds) or "nobody (first node)"
        log.info("gossip on %s (profile %s), joining %s", self.addr, self.config.profile, seeds)
        self._started_at = loop.time()
        self._run(self.swim.join(self.config.seeds, self._started_at))
        if self.swim.seeds and not self._joined:
            self._seed_timer = loop.call_at(self._started_at + self._seed_silence_s, self._seeds_silent)

    async def aclose(self) -> None:
        """Leave gracefully (spread the notice for a bounded time), then close the sockets."""
        self._stop_seed_watch()
        swim, loop = self.swim, self._loop
        if swim is not None and loop is not None and self._open:
            started, bound_s = loop.time(), 20 * self.swim_config.gossip_interval_s
            self._run(swim.leave(loop.time()))
            try:  # bounded: a leave is best effort
                await asyncio.wait_for(self._left.wait(), bound_s)
                log.info("left the cluster: leave notice spread in %.3f s", loop.time() - started)
            except TimeoutError:
                log.warning("left the cluster: leave notice not fully spread within %.1f s", bound_s)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await cancel_all(*self._streams_out)
        if self._open:
            self._open = False
            await self.transport.aclose()

    # ------------------------------------------------------------ public view

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` for every membership change (on the event loop; keep it quick)."""
        self._listeners.append(listener)

    def members(self) -> list[NodeState]:
        """Every member this node knows, itself included, sorted by name."""
        if self.swim is None:
            return []
        return sorted(self.swim.members(), key=lambda m: m.name)

    def set_meta(self, meta: NodeMeta) -> None:
        """Publish new metadata (gossiped with a new incarnation)."""
        self.meta = meta
        if self.swim is not None and self._loop is not None:
            self._run(self.swim.set_meta(meta, self._loop.time()))

    # ------------------------------------------------------------ inbound

    def _on_datagram(self, data: bytes, from_addr: str) -> None:
        swim, loop = self.swim, self._loop
        if swim is not None and loop is not None:
            now, rejected = loop.time(), swim.auth_drops
            self._run(swim.handle_packet(data, from_addr, now))
            if swim.auth_drops != rejected:
                self._bad_hmac(from_addr, now)

    def _on_udp_error(self, exc: OSError) -> None:
        # ICMP port unreachable and the like: the peer is gone, which probing finds out.
        self.stats["udp_errors"] += 1

    async def _on_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._streams_in >= _MAX_STREAMS:
            self.stats["streams_refused"] += 1
            writer.close()
            return
        self._streams_in += 1
        try:
            async with asyncio.timeout(self._stream_timeout_s):
                (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                if length > self.swim_config.max_stream_bytes:
                    self.stats["streams_too_large"] += 1
                    return
                data = await reader.readexactly(length)
            self.stats["streams_in"] += 1
            swim, loop = self.swim, self._loop
            if swim is not None and loop is not None:
                now, rejected = loop.time(), swim.auth_drops
                self._run(swim.handle_stream(data, now))
                if swim.auth_drops != rejected:
                    peer = writer.get_extra_info("peername")
                    self._bad_hmac(f"{peer[0] if peer else 'unknown'} (TCP)", now)
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            self.stats["stream_errors_in"] += 1
        finally:
            self._streams_in -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _bad_hmac(self, sender: str, now: float) -> None:
        dropped = self._bad_hmacs.dropped(sender, now)
        if dropped is not None:
            log.warning(
                "dropped gossip from %s: bad HMAC — wrong cluster.secret? (%d dropped so far)",
                sender,
                dropped,
            )

    def _seeds_silent(self) -> None:
        self._seed_timer = None
        loop, swim = self._loop, self.swim
        if loop is None or swim is None or self._joined:
            return
        self._seed_warned = True
        log.warning(
            "no seed answered in %g s: %s — are they up, and is cluster.secret the same?",
            round(loop.time() - self._started_at, 1),
            ", ".join(swim.seeds),
        )
        self._seed_timer = loop.call_later(SEED_WARNING_REPEAT_S, self._seeds_silent)

    def _stop_seed_watch(self) -> None:
        if self._seed_timer is not None:
            self._seed_timer.cancel()
            self._seed_timer = None

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        if self.swim is not None and self._loop is not None:
            self._run(self.swim.tick(self._loop.time()))

    # ------------------------------------------------------------ effects

    def _run(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                self._send(effect)
            elif isinstance(effect, SendStream):
                self._start_stream(effect)
            else:
                self._changed(effect)
        if self.swim is not None and self.swim.leave_done:
            self._left.set()
        self._schedule()

    def _schedule(self) -> None:
        loop, swim = self._loop, self.swim
        if loop is None or swim is None or not self._open:
            return
        at = swim.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at != float("inf"):
            self._timer = loop.call_at(max(at, loop.time()), self._on_timer)

    def _resolve(self, addr: str) -> tuple[str, int] | None:
        target = self._resolved.get(addr)
        if target is None:
            try:
                target = split_addr(addr)
            except ValueError:
                self.stats["bad_addresses"] += 1
                return None
            if len(self._resolved) >= _ADDR_CACHE_MAX:
                self._resolved.clear()
            self._resolved[addr] = target
        return target

    def _send(self, effect: Send) -> None:
        target = self._resolve(effect.addr)
        if target is None or not self._open:
            return
        try:
            self.transport.sendto(effect.data, target)
        except OSError:
            self.stats["udp_errors"] += 1

    def _start_stream(self, effect: SendStream) -> None:
        if len(self._streams_out) >= _MAX_STREAMS or not self._open:
            self.stats["streams_dropped"] += 1
            return
        task = asyncio.get_running_loop().create_task(self._stream(effect))
        self._streams_out.add(task)
        task.add_done_callback(self._streams_out.discard)

    async def _stream(self, effect: SendStream) -> None:
        target = self._resolve(effect.addr)
        if target is None:
            return
        try:
            async with asyncio.timeout(self._stream_timeout_s):
                _, writer = await self.transport.open_stream(target)
                try:
                    writer.write(_LENGTH.pack(len(effect.data)) + effect.data)
                    await writer.drain()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (TimeoutError, OSError):
            self.stats["stream_errors_out"] += 1

    def _changed(self, change: MemberChanged) -> None:
        if not self._joined and change.name != self.meta.name and change.state is State.ALIVE:
            self._joined = True
            self._stop_seed_watch()
            if self._seed_warned and self._loop is not None:
                log.info(
                    "heard from the cluster after %g s: %s (%s) is alive",
                    round(self._loop.time() - self._started_at, 1),
                    change.name,
                    change.addr,
                )
        if change.name != self.meta.name and change.state is not change.previous:
            level = logging.WARNING if change.state in (State.SUSPECT, State.DEAD) else logging.INFO
            log.log(
                level,
                "member %s (%s) is %s (incarnation %d)",
                change.name,
                change.addr,
                change.state.value,
                change.incarnation,
            )
        for listener in self._listeners:
            try:
                listener(change)
            except Exception:
                log.exception("membership listener failed")
