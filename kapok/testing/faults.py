"""Faults for a real node, as parts it is assembled with (``kapok.node.seams.Seams``).

* ``FaultyTransport`` wraps the gossip node's real transport: it drops each datagram
  with a probability, both ways (TCP state exchange is left alone, as a lossy network
  leaves TCP to retransmit), and while cut it drops every datagram and refuses every
  stream, both ways — the node is alone on the network.
* ``FaultySyncLink`` is the sync link (``SyncLink``) that, while cut, makes sends and
  reads wait until the cut heals: the WebSocket stays open, as TCP does through a short
  partition. It can also make each frame read wait (a slow slave).
* ``stall_loop`` blocks the event loop for a while, again and again (a GC pause, CPU
  starvation).
* ``FaultFile`` reads the faults a test changes while the node runs (JSON, read again
  when the last reading is 50 ms old): ``isolate``, ``block_sync``, ``sync_delay_ms``.

``python -m kapok.faulty`` puts these into a ``kapok serve`` process; tests may use them
in process.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kapok.cluster.transport import (
    DatagramHandler,
    ErrorHandler,
    StreamHandler,
    Transport,
    UdpTcpTransport,
)
from kapok.replication.link import SyncLink, WebSocket
from kapok.replication.session import Frame

__all__ = ["FaultFile", "FaultySyncLink", "FaultyTransport", "stall_loop"]

_REREAD_S = 0.05  # the fault file is read again when the last reading is this old
_HEAL_POLL_S = 0.02  # a cut sync link looks this often whether it healed


def _never() -> bool:
    return False


def _no_delay() -> float:
    return 0.0


class FaultFile:
    """The faults of a JSON file a test rewrites while the node runs (a missing, empty or
    half-written file reads as no fault)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._read_at = float("-inf")
        self._faults: dict[str, Any] = {}

    def _refresh(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._read_at >= _REREAD_S:
            self._read_at = now
            try:
                faults = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                faults = {}
            self._faults = faults if isinstance(faults, dict) else {}
        return self._faults

    def isolated(self) -> bool:
        """``isolate``: cut from everyone (gossip both ways, and the sync link)."""
        return bool(self._refresh().get("isolate"))

    def sync_cut(self) -> bool:
        """``isolate`` or ``block_sync``: the sync link is cut."""
        faults = self._refresh()
        return bool(faults.get("isolate")) or bool(faults.get("block_sync"))

    def sync_delay_s(self) -> float:
        """``sync_delay_ms``: how long each frame read from the sync link waits."""
        try:
            return float(self._refresh().get("sync_delay_ms", 0)) / 1000
        except (TypeError, ValueError):
            return 0.0


class FaultyTransport:
    """A gossip transport around another (the real one by default) that loses datagrams
    with probability ``loss`` and is cut while ``isolated`` is set or ``cut()`` says so."""

    def __init__(
        self,
        inner: Transport | None = None,
        *,
        loss: float = 0.0,
        rng: random.Random | None = None,
        cut: Callable[[], bool] = _never,
    ) -> None:
        self.inner: Transport = inner if inner is not None else UdpTcpTransport()
        self.loss = loss
        self.rng = rng or random.Random()
        self.isolated = False  # set by a test: cut until cleared
        self._cut = cut
        self.dropped = 0  # datagrams dropped, both ways
        self.refused = 0  # streams refused, both ways

    def cut(self) -> bool:
        return self.isolated or self._cut()

    def _drop(self) -> bool:
        if self.cut() or (self.loss > 0 and self.rng.random() < self.loss):
            self.dropped += 1
            return True
        return False

    async def start(
        self,
        host: str,
        port: int,
        *,
        on_datagram: DatagramHandler,
        on_stream: StreamHandler,
        on_error: ErrorHandler,
    ) -> int:
        def datagram(data: bytes, from_addr: str) -> None:
            if not self._drop():
                on_datagram(data, from_addr)

        async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if self.cut():
                self.refused += 1
                writer.close()
                return
            await on_stream(reader, writer)

        return await self.inner.start(host, port, on_datagram=datagram, on_stream=stream, on_error=on_error)

    def sendto(self, data: bytes, target: tuple[str, int]) -> None:
        if not self._drop():
            self.inner.sendto(data, target)

    async def open_stream(self, target: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.cut():
            self.refused += 1
            raise ConnectionRefusedError(f"gossip stream to {target[0]}:{target[1]}: cut by a fault")
        return await self.inner.open_stream(target)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FaultySyncLink(SyncLink):
    """A sync link whose sends and reads wait while ``cut()`` (the link stays open) and
    whose every frame read waits ``delay_s()`` more."""

    def __init__(
        self, ws: WebSocket, *, cut: Callable[[], bool] = _never, delay_s: Callable[[], float] = _no_delay
    ) -> None:
        super().__init__(ws)
        self._is_cut = cut
        self._delay_s = delay_s

    async def _healed(self) -> None:
        while self._is_cut():  # noqa: ASYNC110 - the faults are polled, nothing signals
            await asyncio.sleep(_HEAL_POLL_S)

    async def send_control(self, op: str, **fields: Any) -> None:
        await self._healed()
        await super().send_control(op, **fields)

    async def send_binary(self, data: bytes) -> None:
        await self._healed()
        await super().send_binary(data)

    async def receive(self, timeout: float | None = None) -> Frame | None:
        if timeout is None:
            await self._healed()
        else:
            await asyncio.wait_for(self._healed(), timeout)
        frame = await super().receive(timeout)
        delay = self._delay_s()
        if delay:
            await asyncio.sleep(delay)
        return frame


def stall_loop(block_s: float, every_s: float, until_s: float) -> None:
    """From now on (call it on the running loop), block the loop ``block_s`` seconds
    every ``every_s`` seconds, for the first ``until_s`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + until_s

    def stall() -> None:
        time.sleep(block_s)  # deliberately blocks the whole event loop
        if loop.time() + every_s < end:
            loop.call_later(every_s, stall)

    loop.call_later(every_s, stall)
