"""The workloads of ``kapok bench``; each measures one thing and returns its row(s).

publish   one producer, confirmed publishes: native ``pub`` frames of ``--batch`` messages
          with ``--inflight`` frames unconfirmed; KapokMQ one frame per message with
          ``batch × inflight`` messages unconfirmed. msgs/s = confirmed / (last confirm − start).
e2e       that producer plus one manual-ack consumer (subscribed first).
          msgs/s = consumed / (last consumed − first published).
latency   the producer paced at ``--rate`` msg/s for ``--seconds`` (native: the messages due
          at each 1 ms tick in one frame; KapokMQ: one frame each), a monotonic-ns stamp in
          the payload; the consumer acks each and records arrival − stamp. p50/p99/max ms.
roundtrip one producer with one message in flight for ``--seconds`` (at most ``--messages``):
          send it, wait for its confirmation (``puback`` / ``ok``), send the next.
          p50/p99/max ms of send → confirmation; msgs/s = confirmed / elapsed.
fanout    ``--fanout`` K subscribers, each in its own group (native: named groups; KapokMQ:
          a pub/sub topic), each must receive every message. msgs/s = deliveries
          (K × N) / (last consumed − first published).
clients   ``--clients`` C producer connections and C consumer connections (one group, the
          consumers compete) on one topic; N messages in all. msgs/s as e2e.
backlog   ``--backlog`` messages published with no consumer; node RSS before and after,
          per queued message (local node only), WAL bytes per message.
client    the client library (``kapok.client.Producer``, as an application uses it: one
          ``send`` per message, generated dedup ids) publishing ``--messages`` to the node with
          one batch in flight and with ``--inflight`` batches, each run right after the raw
          producer of ``publish`` with the same batch and window; notes give library ÷ raw.
soak      ``--minutes`` of mixed load on both protocols with disconnects, nacks and a kill -9
          (``kapok.bench.soak``): published / confirmed / delivered / lost / duplicates and the
          node's RSS over time. Not part of ``all``.
scrape    ``--topics`` topics, a producer paced with one publish in flight, and three phases
          of ``--seconds``: no scrapers, 8 polling ``/metrics`` without the key, 8 with it;
          p50/p99 of send → confirmation per phase and their ratios (``kapok.bench.scrape``).
          Not part of ``all``.
recovery  the same backlog, then the node is killed (kill -9: WAL replay) and restarted, then
          stopped (SIGTERM: shutdown snapshot) and restarted; time until ``/health`` answers
          and the recovery time from the node's "recovered ... in X s" log line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kapok.bench.harness import FANOUT_TOPIC, CaseFailed, Harness, RoleRun
from kapok.bench.nodes import LocalNode, Node
from kapok.bench.report import Row
from kapok.bench.scrape import scrape
from kapok.bench.soak import soak

__all__ = ["LONG_WORKLOADS", "WORKLOADS", "Workload"]

Workload = Callable[[Harness, Node, str], list[Row]]


def _rate(count: int, t0: float, t1: float) -> float:
    if count <= 0 or t1 <= t0:
        raise CaseFailed(f"nothing measurable ({count} messages in {t1 - t0:.3f} s)")
    return count / (t1 - t0)


def _consumer(run: RoleRun) -> dict[str, Any]:
    assert run.consumer is not None
    return run.consumer


def _e2e_rate(run: RoleRun, deliveries: int) -> tuple[float, float]:
    consumer = _consumer(run)
    got = int(consumer["got"])
    if got < deliveries:
        raise CaseFailed(f"only {got:,} of {deliveries:,} messages consumed")
    t0, t_last = float(run.producer["t0"]), float(consumer["t_last"])
    return _rate(got, t0, t_last), t_last - t0


def publish(h: Harness, node: Node, protocol: str) -> list[Row]:
    n = h.options.messages
    run = h.run_roles(node, h.spec("producer", protocol, node, h.topic("publish"), messages=n))
    p = run.producer
    rate = _rate(p["confirmed"], p["t0"], p["t1"])
    return [h.row("publish", protocol, node, run, messages=n, msgs_per_s=rate, wall_s=p["t1"] - p["t0"])]


def e2e(h: Harness, node: Node, protocol: str) -> list[Row]:
    n = h.options.messages
    topic = h.topic("e2e")
    run = h.run_roles(
        node,
        h.spec("producer", protocol, node, topic, messages=n),
        h.spec("consumer", protocol, node, topic, messages=n),
        consumed_target=n,
    )
    rate, wall = _e2e_rate(run, n)
    return [h.row("e2e", protocol, node, run, messages=n, msgs_per_s=rate, wall_s=wall)]


def latency(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    n = max(1, int(o.rate * o.seconds))
    topic = h.topic("latency")
    run = h.run_roles(
        node,
        h.spec("producer", protocol, node, topic, messages=n, rate=o.rate),
        h.spec("consumer", protocol, node, topic, messages=n, latency=True),
        consumed_target=n,
    )
    _, wall = _e2e_rate(run, n)
    p, c = run.producer, _consumer(run)
    row = h.row("latency", protocol, node, run, messages=n, wall_s=wall)
    row.msgs_per_s = _rate(p["confirmed"], p["t0"], p["t1"])
    row.p50_ms, row.p99_ms, row.max_ms = c.get("p50_ms"), c.get("p99_ms"), c.get("max_ms")
    row.notes = f"paced at {o.rate:,.0f} msg/s for {o.seconds:g} s"
    return [row]


def roundtrip(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    spec = h.spec("producer", protocol, node, h.topic("roundtrip"), messages=o.messages, roundtrip=o.seconds)
    run = h.run_roles(node, spec)
    p = run.producer
    row = h.row("roundtrip", protocol, node, run, messages=p["confirmed"], wall_s=p["t1"] - p["t0"])
    row.msgs_per_s = _rate(p["confirmed"], p["t0"], p["t1"])
    row.p50_ms, row.p99_ms, row.max_ms = p.get("p50_ms"), p.get("p99_ms"), p.get("max_ms")
    row.notes = f"one message in flight for {o.seconds:g} s; send → confirmation"
    return [row]


def fanout(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    n, k = o.messages, o.fanout
    # Native: a fresh topic and K named groups. KapokMQ: the pub/sub topic, one group per connection.
    topic = h.topic("fanout") if protocol == "native" else FANOUT_TOPIC
    run = h.run_roles(
        node,
        h.spec("producer", protocol, node, topic, messages=n),
        h.spec(
            "consumer", protocol, node, topic, messages=n, clients=k, fanout=True, group_prefix=f"g{h.nonce}-"
        ),
        consumed_target=n * k,
    )
    try:
        rate, wall = _e2e_rate(run, n * k)
    except CaseFailed as exc:
        if protocol == "kapokmq" and not node.local:
            raise CaseFailed(f"{exc}; is topic {FANOUT_TOPIC} pub/sub (push_type 2) on that node?") from None
        raise
    row = h.row("fanout", protocol, node, run, messages=n, msgs_per_s=rate, wall_s=wall)
    row.notes = f"{k} subscribers; msgs/s counts deliveries ({n / wall:,.0f} published msg/s reached all)"
    return [row]


def clients(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    n, c = o.messages, o.clients
    topic = h.topic("clients")
    per_producer = -(-n // c)
    run = h.run_roles(
        node,
        h.spec(
            "producer",
            protocol,
            node,
            topic,
            messages=n,
            clients=c,
            window=min(o.batch * o.inflight, per_producer),
        ),
        h.spec("consumer", protocol, node, topic, messages=n, clients=c),
        consumed_target=n,
    )
    rate, wall = _e2e_rate(run, n)
    row = h.row("clients", protocol, node, run, messages=n, msgs_per_s=rate, wall_s=wall)
    row.notes = f"{c} producers + {c} consumers"
    return [row]


def client(h: Harness, node: Node, protocol: str) -> list[Row]:
    o = h.options
    n = o.messages
    rows: list[Row] = []
    # Raw and library back to back for each window, so both see the same minute of a noisy machine.
    for inflight in sorted({1, o.inflight}):
        raw_rate = 0.0
        for kind in ("raw", "library"):
            spec = h.spec(
                "producer", protocol, node, h.topic(f"client{len(rows)}"), messages=n, client=kind,
                window=o.batch * inflight,
            )  # fmt: skip
            run = h.run_roles(node, spec)
            p = run.producer
            rate = _rate(p["confirmed"], p["t0"], p["t1"])
            row = h.row("client", protocol, node, run, variant=f"{kind}, {inflight} in flight", messages=n)
            row.msgs_per_s, row.wall_s = rate, p["t1"] - p["t0"]
            row.notes = f"batch {o.batch} × {inflight} in flight"
            if kind == "raw":
                raw_rate = rate
            else:
                row.extra["ratio_to_raw"] = rate / raw_rate
                row.notes += f"; kapok.client ÷ raw = {rate / raw_rate:.2f}"
            rows.append(row)
    return rows


def _fill(h: Harness, node: Node, protocol: str, workload: str) -> tuple[RoleRun, Row]:
    n = h.options.backlog
    run = h.run_roles(node, h.spec("producer", protocol, node, h.topic(workload), messages=n))
    p = run.producer
    row = h.row(workload, protocol, node, run, messages=n, wall_s=p["t1"] - p["t0"])
    row.msgs_per_s = _rate(p["confirmed"], p["t0"], p["t1"])
    return run, row


def backlog(h: Harness, node: Node, protocol: str) -> list[Row]:
    run, row = _fill(h, node, protocol, "backlog")
    n = row.messages
    time.sleep(0.5)  # let the node settle (writer thread, buffers) before reading RSS
    after = node.rss_bytes()
    row.node_rss_bytes = after
    notes = []
    if run.rss_before is not None and after is not None:
        delta = after - run.rss_before
        row.extra.update(rss_before_bytes=run.rss_before, rss_after_bytes=after, rss_bytes_per_msg=delta / n)
        notes.append(f"RSS +{delta / 2**20:,.1f} MB = {delta / n:,.0f} B/queued msg")
    else:
        notes.append("RSS n/a (node not local; see --node-pid)")
    if isinstance(node, LocalNode):
        wal = node.disk_bytes("wal")
        row.extra.update(wal_bytes=wal, wal_bytes_per_msg=wal / n)
        notes.append(f"WAL {wal / n:,.0f} B/msg")
    row.notes = "; ".join([*notes, "msgs/s = publish rate"])
    return [row]


def recovery(h: Harness, node: Node, protocol: str) -> list[Row]:
    if not isinstance(node, LocalNode):
        raise CaseFailed("needs a node started by the bench (not --url)")
    _, fill = _fill(h, node, protocol, "recovery")
    n = fill.messages
    rows = []
    for variant, halt in (("kill -9", node.kill), ("stop", node.stop)):
        h.progress.show(f"{h.label}: {variant} and restart with {n:,} messages", force=True)
        halt()
        restart_s = node.start()
        recovered = node.recovered()
        row = h.row("recovery", protocol, node, None, variant=variant, messages=n, wall_s=restart_s)
        row.node_rss_bytes = node.rss_bytes()
        row.extra.update(health_after_s=restart_s, first_start_s=node.first_start_s)
        source = "WAL replay" if variant == "kill -9" else "shutdown snapshot"
        if recovered is None:
            raise CaseFailed("the node printed no 'recovered ... in X s' line")
        count, seconds = recovered
        row.extra.update(recovered_messages=count, recovered_s=seconds)
        row.notes = (
            f"{source}: {count:,} msgs recovered in {seconds:.2f} s (log); /health after {restart_s:.2f} s "
            f"(empty node: {node.first_start_s:.2f} s)"
        )
        rows.append(row)
    return rows


WORKLOADS: dict[str, Workload] = {
    "publish": publish,
    "e2e": e2e,
    "latency": latency,
    "roundtrip": roundtrip,
    "fanout": fanout,
    "clients": clients,
    "backlog": backlog,
    "recovery": recovery,
    "client": client,
    "soak": soak,
    "scrape": scrape,
}
# Chosen by name only, never by "all": minutes long (soak), or a question of its own (scrape).
LONG_WORKLOADS = ("soak", "scrape")
