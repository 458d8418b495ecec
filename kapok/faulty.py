"""``kapok serve`` with injected gossip faults, for the R4 / R5 measurements.

    python -m kapok.faulty [--loss P] [--block-s S --every-s T --until-s U] -- serve [args]

``--loss P`` drops each gossip datagram with probability P, both directions (a wrapper
around the node's datagram transport: what leaves and what arrives); TCP state exchange is
left alone, as a lossy network would leave TCP to retransmit. ``--block-s S --every-s T``
blocks the node's event loop for S seconds every T seconds, for the first U seconds (a
stalled process: GC pause, CPU starvation). Everything else is the real node.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from kapok.cli import main as kapok_main
from kapok.cluster.messages import Send
from kapok.cluster.node import GossipNode

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kapok.faulty", description=__doc__)
    parser.add_argument("--loss", type=float, default=0.0, help="datagram drop probability, each way")
    parser.add_argument("--block-s", type=float, default=0.0, help="seconds the event loop is blocked")
    parser.add_argument("--every-s", type=float, default=10.0, help="period of the blocks")
    parser.add_argument("--until-s", type=float, default=float("inf"), help="no more blocks after this")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("kapok_args", nargs=argparse.REMAINDER, help="-- then the kapok command line")
    args = parser.parse_args(argv)
    if args.loss > 0:
        _inject_loss(args.loss, random.Random(args.seed))
    if args.block_s > 0:
        _inject_stalls(args.block_s, args.every_s, args.until_s)
    rest = args.kapok_args[1:] if args.kapok_args[:1] == ["--"] else args.kapok_args
    return kapok_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
