"""Run the SWIM simulator scenarios and print measured figures against their targets.

    python -m kapok.bench.gossip_sim --nodes 1000 --seeds 5 --scenario all
    python -m kapok.bench.gossip_sim --nodes 200 --seeds 3 --scenario S1,S6 --profile lan

Scenarios: S1 crash detection, S2 join dissemination,
S3 cluster formation, S4 false positives under loss, S5 slow nodes with and without
Lifeguard, S6 partition and heal, S7 quiescent load, S8 determinism and speed. The exit
status is 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from kapok.bench.gossip_harness import Params, Result
from kapok.bench.gossip_scenarios import SCENARIOS
from kapok.cluster.config import PROFILES, SwimConfig

__all__ = ["format_table", "main", "run"]


def run(names: Sequence[str], params: Params, progress: bool = False) -> list[Result]:
    results = []
    for name in names:
        t0 = time.perf_counter()
        result = SCENARIOS[name](params)
        result.wall_s = time.perf_counter() - t0
        results.append(result)
        if progress:
            print(format_table([result]), flush=True)
    return results


def format_table(results: Sequence[Result]) -> str:
    rows = [("", "metric", "measured", "target", "")]
    for res in results:
        rows.append((res.scenario, f"{res.title} [{res.wall_s:.0f} s wall]", "", "", ""))
        for c in res.checks:
            mark = "" if c.ok is None else ("ok" if c.ok else "MISS")
            rows.append(("", "  " + c.metric, c.measured, c.target, mark))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kapok.bench.gossip_sim", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000, help="cluster size N (default 1000)")
    ap.add_argument("--seeds", type=int, default=5, help="seeded runs per scenario arm (default 5)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--scenario", default="all", help="S1..S8, comma-separated, or all")
    ap.add_argument("--profile", default="lan", choices=sorted(PROFILES), help="timing profile")
    ap.add_argument(
        "--duration", type=float, default=600.0, help="simulated seconds of S4 and S8's speed run"
    )
    ap.add_argument(
        "--quick", action="store_true", help="one arm per scenario (one loss level, one slow share)"
    )
    ap.add_argument(
        "--no-tcp-pings", action="store_true", help="turn the TCP fallback ping off (SwimConfig.tcp_pings)"
    )
    ap.add_argument(
        "--tcp-rto",
        action="store_true",
        help="lost stream segments cost Linux's TCP retransmission timeouts (default: loss spares streams)",
    )
    args = ap.parse_args(argv)
    names = (
        list(SCENARIOS) if args.scenario == "all" else [s.strip().upper() for s in args.scenario.split(",")]
    )
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    if args.nodes < 10 or args.seeds < 1:
        ap.error("--nodes must be at least 10 and --seeds at least 1")
    config: SwimConfig = SwimConfig.profile(args.profile, tcp_pings=not args.no_tcp_pings)
    params = Params(args.nodes, args.seeds, args.first_seed, config, args.duration, args.quick, args.tcp_rto)
    print(
        f"N={args.nodes}, {args.seeds} seed(s) from {args.first_seed}, profile {args.profile}, "
        f"TCP pings {'off' if args.no_tcp_pings else 'on'}, "
        f"TCP retransmission timeouts {'on' if args.tcp_rto else 'off'}",
        flush=True,
    )
    results = run(names, params, progress=True)
    print()
    print(format_table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
