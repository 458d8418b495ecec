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

The faults themselves are parts the node is assembled with (``kapok.testing.faults``,
given through ``kapok.node.seams.Seams``); this module only reads the command line.
"""

from __future__ import annotations

import argparse
import functools
import random
from collections.abc import Callable
from pathlib import Path

from kapok.cli import main as kapok_main
from kapok.cluster.transport import Transport
from kapok.node.seams import Seams
from kapok.replication.link import LinkFactory
from kapok.testing.faults import FaultFile, FaultySyncLink, FaultyTransport, stall_loop

__all__ = ["main", "seams"]


def seams(args: argparse.Namespace) -> Seams:
    """The node's seams for the parsed options: the real parts where no fault asks otherwise."""
    faults = FaultFile(args.fault_file) if args.fault_file is not None else None
    transport: Callable[[], Transport] | None = None
    if args.loss > 0 or faults is not None:
        rng = random.Random(args.seed)
        cut = faults.isolated if faults is not None else (lambda: False)
        transport = functools.partial(FaultyTransport, loss=args.loss, rng=rng, cut=cut)
    link: LinkFactory | None = None
    if faults is not None:
        link = functools.partial(FaultySyncLink, cut=faults.sync_cut, delay_s=faults.sync_delay_s)
    stalls = None
    if args.block_s > 0:
        stalls = functools.partial(stall_loop, args.block_s, args.every_s, args.until_s)
    return Seams(gossip_transport=transport, sync_link=link, on_gossip_started=stalls)


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
    rest = args.kapok_args[1:] if args.kapok_args[:1] == ["--"] else args.kapok_args
    return kapok_main(rest, seams=seams(args))


if __name__ == "__main__":
    raise SystemExit(main())
