#!/usr/bin/env bash
# Kapok against the peer benchmark (Redis Streams, RabbitMQ, NATS JetStream), side by side:
# the same e2e / publish-batch / latency cases, interleaved in rounds so that background
# noise falls on every system alike, then medians and ratios Kapok ÷ each peer.
#
#   build/bench-compare.sh PEER_BENCH_DIR
#
# PEER_BENCH_DIR is a writable copy of the peer benchmark folder (servers.sh, bench_peers.py;
# see the README there: it writes .venv/, .run/ and results/ beside itself). The brokers come
# from apt (apt-get install -y redis-server rabbitmq-server nats-server); a system whose
# server is not installed is skipped. The peers' Python clients are installed into
# PEER_BENCH_DIR/.venv on first use, as that folder's README says.
#
# Environment (defaults in brackets):
#   ROUNDS [3]                     rounds; each runs every case of every system once
#   N [100000]                     messages per e2e / publish run (latency: 2000 msg/s for 10 s)
#   SYSTEMS [redis rabbitmq nats]  peers to run (those installed)
#   CASES [e2e publish latency]
#   KAPOK_PROTOCOL [both]          native, kapokmq or both
#   KAPOK_FSYNC [always]           Kapok's storage.fsync for e2e and publish (peers run --durable)
#   KAPOK_LATENCY_FSYNC [interval,always]
#   OUT [a new temporary folder]   where the raw results and compare.md go
#
# Kapok's cases run through `python -m kapok bench` (a fresh node per case); the peers'
# through PEER_BENCH_DIR/bench_peers.py with --runs 1 per round. Output: Markdown on stdout,
# also written to $OUT/compare.md; raw data in $OUT/kapok-*.json and $OUT/peers.raw.
set -euo pipefail

usage() { echo "usage: $0 PEER_BENCH_DIR   (a writable copy of the peer benchmark folder)" >&2; exit 2; }
[ $# -eq 1 ] || usage
[ -d "$1" ] || { echo "bench-compare: no such folder: $1" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
peer=$(cd "$1" && pwd)
for f in servers.sh bench_peers.py; do
    [ -f "$peer/$f" ] || { echo "bench-compare: $peer has no $f: not the peer benchmark folder" >&2; exit 2; }
done
[ -w "$peer" ] || { echo "bench-compare: $peer is not writable; copy the folder first (cp -r)" >&2; exit 2; }

ROUNDS=${ROUNDS:-3}
N=${N:-100000}
CASES=${CASES:-"e2e publish latency"}
KAPOK_PROTOCOL=${KAPOK_PROTOCOL:-both}
KAPOK_FSYNC=${KAPOK_FSYNC:-always}
KAPOK_LATENCY_FSYNC=${KAPOK_LATENCY_FSYNC:-interval,always}
OUT=${OUT:-$(mktemp -d -t kapok-compare-XXXX)}
mkdir -p "$OUT"

kapok_py="$repo/.venv/bin/python"
[ -x "$kapok_py" ] || kapok_py=python3
"$kapok_py" -c 'import kapok.bench' 2>/dev/null || {
    echo "bench-compare: kapok is not importable by $kapok_py; run build/test.sh (or pip install -e .) first" >&2
    exit 2
}

peer_py="$peer/.venv/bin/python"
if ! [ -x "$peer_py" ] || ! "$peer_py" -c 'import redis, aio_pika, nats, uvloop' 2>/dev/null; then
    echo "== installing the peer clients into $peer/.venv" >&2
    python3 -m venv "$peer/.venv"
    "$peer/.venv/bin/pip" install --quiet --disable-pip-version-check redis aio-pika nats-py aiohttp uvloop orjson
fi

server_binary() {
    case $1 in
        redis) echo redis-server ;;
        rabbitmq) echo rabbitmq-server ;;
        nats) echo nats-server ;;
        *) echo "$1" ;;
    esac
}
systems=()
for s in ${SYSTEMS:-redis rabbitmq nats}; do
    if command -v "$(server_binary "$s")" >/dev/null 2>&1 || [ -x "/usr/sbin/$(server_binary "$s")" ]; then
        systems+=("$s")
    else
        echo "bench-compare: skipping $s: $(server_binary "$s") is not installed" >&2
    fi
done

started=()
cleanup() {
    for s in "${started[@]}"; do (cd "$peer" && ./servers.sh stop "$s" >&2) || true; done
}
trap cleanup EXIT
export PATH="$PATH:/usr/sbin:/sbin"  # rabbitmq-server and nats-server live in sbin
for s in "${systems[@]}"; do
    if (cd "$peer" && ./servers.sh start "$s" >&2); then
        started+=("$s")
    else
        echo "bench-compare: $s did not start; skipped" >&2
    fi
done

kapok_case() { # round, case
    local round=$1 case=$2 fsync=$KAPOK_FSYNC
    [ "$case" = latency ] && fsync=$KAPOK_LATENCY_FSYNC
    echo "== round $round: kapok $case ($KAPOK_PROTOCOL, fsync $fsync)" >&2
    (cd "$OUT" && timeout 1200 "$kapok_py" -m kapok bench --workload "$case" --protocol "$KAPOK_PROTOCOL" \
        --fsync "$fsync" --messages "$N" --json > "$OUT/kapok-r$round-$case.json") \
        || echo "!! kapok $case failed in round $round (see the rows in $OUT/kapok-r$round-$case.json)" >&2
}

peer_case() { # round, system, case
    local round=$1 s=$2 case=$3 args
    case $case in
        e2e) args=(--mode e2e --confirm batch --durable) ;;
        publish) args=(--mode publish --confirm batch --durable) ;;
        latency) args=(--mode latency) ;;
        *) echo "bench-compare: unknown case $case" >&2; return ;;
    esac
    echo "== round $round: $s ${args[*]}" >&2
    (cd "$peer" && timeout 600 "$peer_py" bench_peers.py --system "$s" --runs 1 -n "$N" \
        --server-pid "$(./servers.sh pid "$s")" --out "$OUT/peers.raw" "${args[@]}" > /dev/null) \
        || echo "!! $s $case failed in round $round" >&2
}

for round in $(seq 1 "$ROUNDS"); do
    for case in $CASES; do
        kapok_case "$round" "$case"
        for s in "${started[@]}"; do peer_case "$round" "$s" "$case"; done
    done
done

touch "$OUT/peers.raw"
{
    echo "# Kapok vs peers, $(date -Iseconds), $ROUNDS round(s), N=$N"
    echo
    "$kapok_py" -m kapok.bench.compare --peers "$OUT/peers.raw" "$OUT"
} | tee "$OUT/compare.md"
echo "bench-compare: raw results and compare.md in $OUT" >&2
