"""``kapok serve`` with injected faults, for the gossip measurements and the partition tests.

    python -m kapok.faulty [--loss P] [--block-s S --every-s T --until-s U]
                           [--fault-file PATH] -- serve [args]

``--loss P`` drops each gossip datagram with probability P, both directions (a wrapper
around the node's datagram transport: what leaves and what arrives); TCP state exchange is
left alone, as a lossy network would leave TCP to retransmit. ``--block-s S --every-s T``
blocks the node's event loop for S seconds every T seconds, for the first U seconds (a
stalled process: GC pause, CPU starvation).

``--fault-file PATH`` names a JSON file the node reads every 50 ms, so a test can change
faults while the node runs: ``{"isolate": true}`` cuts the node off from everyone (its
gossip, datagrams and streams, both ways, and its sync link); ``{"block_sync": true}``
cuts only the master/slave link; ``{"sync_delay_ms": N}`` makes every frame the node
reads from the sync link wait N ms (a slow slave). A cut link stays open, as TCP does
through a short partition: frames wait on both sides and flow again when it heals.
Everything else is the real node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

from kapok.cli import main as kapok_main
from kapok.cluster.messages import Send, SendStream
from kapok.cluster.node import GossipNode
from kapok.replication.link import SyncLink
from kapok.replication.session import Frame

__all__ = ["main"]


def _inject_loss(loss: float, rng: random.Random) -> None:
    send, receive = GossipNode._send, GossipNode._on_datagram

    def lossy_send(self: GossipNode, effect: Send) -> None:
        if rng.random() >= loss:
            send(self, effect)

    def lossy_receive(self: GossipNode, data: bytes, from_addr: str) -> None:
        if rng.random() >= loss:
            receive(self, data, from_addr)

    GossipNode._send = lossy_send  # type: ignore[method-assign]
    GossipNode._on_datagram = lossy_receive  # type: ignore[method-assign]


def _inject_stalls(block_s: float, every_s: float, until_s: float) -> None:
    start = GossipNode.start

    async def start_and_stall(self: GossipNode) -> None:
        await start(self)
        loop = asyncio.get_running_loop()
        end = loop.time() + until_s

        def stall() -> None:
            time.sleep(block_s)  # deliberately blocks the whole event loop
            if loop.time() + every_s < end:
                loop.call_later(every_s, stall)

        loop.call_later(every_s, stall)

    GossipNode.start = start_and_stall  # type: ignore[method-assign]


class _Faults:
    """The faults of the fault file, read again when the last reading is 50 ms old."""

    path: Path | None = None
    read_at = 0.0
    isolate = False
    block_sync = False
    sync_delay_s = 0.0

    @classmethod
    def refresh(cls) -> None:
        now = time.monotonic()
        if cls.path is None or now - cls.read_at < 0.05:
            return
        cls.read_at = now
        try:
            faults: dict[str, Any] = json.loads(cls.path.read_text() or "{}")
        except (OSError, ValueError):
            faults = {}
        cls.isolate = bool(faults.get("isolate"))
        cls.block_sync = bool(faults.get("block_sync"))
        cls.sync_delay_s = float(faults.get("sync_delay_ms", 0)) / 1000

    @classmethod
    def cut(cls) -> bool:
        cls.refresh()
        return cls.isolate

    @classmethod
    def sync_cut(cls) -> bool:
        cls.refresh()
        return cls.isolate or cls.block_sync


def _watch_fault_file(path: Path) -> None:
    _Faults.path = path
    send, receive = GossipNode._send, GossipNode._on_datagram
    stream_out, stream_in = GossipNode._stream, GossipNode._on_stream

    def send_unless_cut(self: GossipNode, effect: Send) -> None:
        if not _Faults.cut():
            send(self, effect)

    def receive_unless_cut(self: GossipNode, data: bytes, from_addr: str) -> None:
        if not _Faults.cut():
            receive(self, data, from_addr)

    async def stream_out_unless_cut(self: GossipNode, effect: SendStream) -> None:
        if not _Faults.cut():
            await stream_out(self, effect)

    async def stream_in_unless_cut(self: GossipNode, reader: asyncio.StreamReader, writer: Any) -> None:
        if _Faults.cut():
            writer.close()
            return
        await stream_in(self, reader, writer)

    GossipNode._send = send_unless_cut  # type: ignore[method-assign]
    GossipNode._on_datagram = receive_unless_cut  # type: ignore[method-assign]
    GossipNode._stream = stream_out_unless_cut  # type: ignore[method-assign]
    GossipNode._on_stream = stream_in_unless_cut  # type: ignore[method-assign]
    _cut_sync_link()


def _cut_sync_link() -> None:
    control, binary, receive = SyncLink.send_control, SyncLink.send_binary, SyncLink.receive

    async def healed() -> None:
        while _Faults.sync_cut():  # noqa: ASYNC110 - the fault file is polled, nothing signals
            await asyncio.sleep(0.02)

    async def send_control(self: SyncLink, op: str, **fields: Any) -> None:
        await healed()
        await control(self, op, **fields)

    async def send_binary(self: SyncLink, data: bytes) -> None:
        await healed()
        await binary(self, data)

    async def receive_when_healed(self: SyncLink, timeout: float | None = None) -> Frame | None:
        if timeout is None:
            await healed()
        else:
            await asyncio.wait_for(healed(), timeout)
        frame = await receive(self, timeout)
        _Faults.refresh()
        if _Faults.sync_delay_s:
            await asyncio.sleep(_Faults.sync_delay_s)
        return frame

    SyncLink.send_control = send_control  # type: ignore[method-assign]
    SyncLink.send_binary = send_binary  # type: ignore[method-assign]
    SyncLink.receive = receive_when_healed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kapok.faulty", description=__doc__)
    parser.add_argument("--loss", type=float, default=0.0, help="datagram drop probability, each way")
    parser.add_argument("--block-s", type=float, default=0.0, help="seconds the event loop is blocked")
    parser.add_argument("--every-s", type=float, default=10.0, help="period of the blocks")
    parser.add_argument("--until-s", type=float, default=float("inf"), help="no more blocks after this")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--fault-file", type=Path, help="JSON faults read every 50 ms (see above)")
    parser.add_argument("kapok_args", nargs=argparse.REMAINDER, help="-- then the kapok command line")
    args = parser.parse_args(argv)
    if args.loss > 0:
        _inject_loss(args.loss, random.Random(args.seed))
    if args.block_s > 0:
        _inject_stalls(args.block_s, args.every_s, args.until_s)
    if args.fault_file is not None:
        _watch_fault_file(args.fault_file)
    rest = args.kapok_args[1:] if args.kapok_args[:1] == ["--"] else args.kapok_args
    return kapok_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
