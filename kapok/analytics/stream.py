"""A Kapok topic as a Spark Structured Streaming source: ``spark.readStream.format("kapok")``.

::

    from kapok.analytics.stream import register
    register(spark)
    df = (spark.readStream.format("kapok").option("seeds", "http://127.0.0.1:8011")
          .option("topic", "orders").option("group", "spark").load())

Theory of operation. Kapok is a queue, not a log: there is no offset to seek to, only
messages leased to a group and acked. A topic lives on every master pair of the cluster
(a producer spreads it), so the source reads every pair, and it makes each batch's share
of a pair a **claim**: a named lease on the node (``GET /v1/topics/{t}/messages?claim=``)
that the node answers again with the same messages as long as they are in flight under
it, that is acked as a whole (``POST /v1/topics/{t}/ack`` with the claim), and that
survives a restart of the node and a slave's takeover of its master.

* ``latestOffset`` (driver) finds the pairs from the cluster view (``masters``), asks
  each pair's active node how many messages the group has ready, and, if any, returns
  the next offset: the source's id, the batch's number, and for each pair how many it may
  take (``maxMessagesPerBatch`` shared among the pairs). No code, no payload: the offset
  is small and bounded (``streamplan``). Spark writes it to its checkpoint before the
  batch runs.
* ``partitions`` makes one small partition per pair of the batch: the pair, its nodes'
  URLs, its claims (named after the offset), nothing else.
* ``read`` (an executor's task) pulls the claims from the pair's active node, moving to
  the pair's other node and backing off while they answer "not now" (a killed master, a
  slave taking over), up to ``RETRY_TIMEOUTS`` × ``timeoutSeconds``; then the task fails
  with one line, and Spark tries it again or fails the query.
* ``commit`` (after Spark committed the batch: the sink has its output) acks each claim
  of the batch on its pair; an ack that cannot be delivered now is tried again at the next
  ``latestOffset``, which also acks its start offset's claims (a driver that died between
  Spark's commit and ours). Acks by claim are idempotent.

Why exactly once: a batch's messages are its claims' messages. A batch replayed (the
query restarted from its checkpoint, a task tried again) asks for the same claims and
gets the same messages, wherever the pair's active node now is; nothing is acked before
the sink committed the batch, so nothing is lost; nothing is read twice, with a sink
that is exactly-once per batch (the file sink, an idempotent ``foreachBatch``). The
condition: a batch must be committed within its lease (``leaseSeconds``, default 600 s,
counted from the pull); a message whose lease ends first leaves its claim and is
delivered again by the node.

``Trigger.AvailableNow`` reads what each pair's group had ready when the query started,
in batches of ``maxMessagesPerBatch``, then stops.

Options: ``seeds`` (comma-separated URLs of any nodes; ``url`` is one seed), ``topic``
(required), ``group`` (default ``default``, the group of a p2p topic's plain consumers),
``startingPosition`` (``latest``: a group the nodes do not have yet is created by the
query and gets what is published after; ``earliest``: it gets every message the topic
still holds; a group that exists reads on from where it is, either way), ``key`` (the
secret key, default ``test``), ``maxMessagesPerBatch`` (1000), ``leaseSeconds`` (600),
``timeoutSeconds`` (30, per HTTP request).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Final

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from kapok.analytics.masters import ClusterView, Pair
from kapok.analytics.pull import NodeClient, message_row, on_pair
from kapok.analytics.streamplan import Offset, StreamOptions, claims, split_limit
from kapok.errors import AnalyticsError, KapokError

__all__ = ["SCHEMA", "KapokPartition", "KapokStreamReader", "KapokStreamSource", "register"]

log = logging.getLogger("kapok.analytics")

SCHEMA: Final = (
    "code STRING, topic STRING, key STRING, priority INT, data BINARY, create_time TIMESTAMP, "
    "attempts INT, headers MAP<STRING, STRING>"
)
VIEW_MAX_AGE_S: Final = 1.0  # the cluster view is asked again at a latestOffset older than this
IDLE_POLL_S: Final = 0.1  # an idle stream asks the nodes at most this often
RECENT_ACKS: Final = 32  # batches whose acks are sent again after a pair's takeover
Row = tuple[Any, ...]


class KapokPartition(InputPartition):
    """One pair's share of a batch: where to ask, and under which claims (no data)."""

    def __init__(self, pair: str, urls: tuple[str, ...], seq: int, claims: list[tuple[str, int]]) -> None:
        self.pair = pair
        self.urls = urls
        self.seq = seq
        self.claims = claims


class KapokStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kapok"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KapokStreamReader(StreamOptions.parse(self.options))


def fetch(options: StreamOptions, part: KapokPartition) -> list[Row]:
    """A partition's messages as rows: its claims pulled from the pair's active node."""

    def pull(node: NodeClient) -> list[Row]:
        rows: list[Row] = []
        for claim, count in part.claims:
            messages = node.pull(options.topic, options.group, count, options.lease_s, claim, options.start)
            rows.extend(message_row(m) for m in messages)
        return rows

    return on_pair(
        part.urls, pull, key=options.key, timeout_s=options.timeout_s, bound_s=options.bound_s,
        what=f"pair {part.pair}, batch {part.seq}",
    )  # fmt: skip


class KapokStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One per query run, in Spark's driver (``read`` runs in the executors' tasks)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._view = ClusterView(options.seeds, options.timeout_s)
        self._viewed_at: float | None = None
        self._initial: Offset | None = None
        self._budget: dict[str, int] | None = None  # AvailableNow: what each pair may still give
        self._acked: OrderedDict[tuple[str, int], None] = OrderedDict()  # (id, seq) acked
        self._unacked: dict[tuple[str, int, str], list[str]] = {}  # (id, seq, pair) -> claims
        self._recent: dict[str, list[str]] = {}  # pair -> claims acked lately, for a takeover
        self._leaders: dict[str, tuple[str, int]] = {}  # pair -> its active node, epoch
        self._quiet: tuple[Offset, float] | None = None  # nothing ready at this offset until then

    # -- Spark's calls (driver) ---------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            self._initial = Offset.initial()
        return self._initial.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        self._budget = self._ready_counts(self._pairs(fresh=True))

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        begin = Offset.from_json(start) if start is not None else Offset.from_json(self.initialOffset())
        want = self.options.max_per_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, max(limit.max_rows, 1))
        quiet = self._quiet
        if quiet is not None and quiet[0] == begin and time.monotonic() < quiet[1] and self._budget is None:
            return begin.to_json()  # nothing was ready a moment ago (Spark asks every 10 ms)
        pairs = self._pairs(fresh=False)
        self._ack_batch(begin, pairs, patient=False)  # Spark committed ``start``
        self._retry_acks(pairs)
        ready = self._ready_counts(pairs)
        if self._budget is not None:
            ready = {name: min(n, self._budget.get(name, 0)) for name, n in ready.items()}
        shares = split_limit(want, ready)
        if not shares:
            self._quiet = (begin, time.monotonic() + IDLE_POLL_S)
            return begin.to_json()
        if self._budget is not None:
            for name, n in shares.items():
                self._budget[name] -= n
        return begin.next(shares).to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = Offset.from_json(start), Offset.from_json(end)
        pairs = self._pairs(fresh=False)
        self._ack_batch(first, pairs, patient=False)
        missing = [name for name, _ in last.pairs if name not in pairs]
        if missing:
            pairs = self._pairs(fresh=True)
        out = []
        for name, count in last.pairs:
            pair = pairs.get(name)
            if pair is None:
                raise AnalyticsError(
                    f"the kapok source: batch {last.seq}: pair {name} is not in the cluster view"
                )
            out.append(KapokPartition(name, pair.urls, last.seq, claims(last, count)))
        return out

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, KapokPartition)
        yield from fetch(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_batch(Offset.from_json(end), self._pairs(fresh=False), patient=True)

    # -- internals (driver) -------------------------------------------------------------

    def _pairs(self, *, fresh: bool) -> dict[str, Pair]:
        """The cluster's pairs, asked again when ``fresh`` or the view is old; re-acks the
        recent claims of a pair whose active node changed (a takeover, a give-back)."""
        now = time.monotonic()
        if fresh or self._viewed_at is None or now - self._viewed_at >= VIEW_MAX_AGE_S:
            try:
                self._view.refresh()
                self._viewed_at = now
            except AnalyticsError:
                if not self._view.pairs:
                    raise
                log.warning("kapok source: no node answered with its cluster view; the last one is used")
            self._follow_leaders(self._view.pairs)
        return self._view.pairs

    def _follow_leaders(self, pairs: dict[str, Pair]) -> None:
        for name, pair in pairs.items():
            if not pair.active:
                continue
            leader = (pair.active, pair.epoch)
            before = self._leaders.get(name)
            self._leaders[name] = leader
            if before is not None and before != leader and self._recent.get(name):
                # An ack the old node took may not have reached the new one (kill -9 just after).
                log.info(
                    "kapok source: pair %s is now served by %s; its recent acks are sent again",
                    name,
                    pair.active,
                )
                self._deliver_acks(pair, list(self._recent[name]), patient=False)

    def _ready_counts(self, pairs: dict[str, Pair]) -> dict[str, int]:
        """Each pair's ready messages for the group (none for a pair that cannot say now).
        A group a node does not have yet is created there at once for ``latest`` (it gets
        what comes after); for ``earliest`` it counts as every live message of the topic,
        and the batch's first pull makes it so (``start=earliest``)."""
        out = {}
        opts = self.options
        for name, pair in pairs.items():
            url = pair.active_url
            if url is None:
                continue  # no active node (a takeover under way): the next batch
            try:
                with NodeClient(url, opts.key, opts.timeout_s) as node:
                    ready, live = node.topic_counts(opts.topic, opts.group)
                    if ready is None and opts.start == "latest":
                        node.release(opts.topic, opts.group, 1)
                        ready, live = node.topic_counts(opts.topic, opts.group)
            except KapokError as exc:
                log.info("kapok source: pair %s cannot say what it has ready now (%s)", name, exc)
                self._viewed_at = None  # ask the view again next time
                continue
            out[name] = live if ready is None else ready
        return out

    def _ack_batch(self, offset: Offset, pairs: dict[str, Pair], *, patient: bool) -> None:
        if (offset.id, offset.seq) in self._acked:
            return
        for name, count in offset.pairs:
            names = [claim for claim, _ in claims(offset, count)]
            self._unacked[(offset.id, offset.seq, name)] = names
            pair = pairs.get(name)
            if pair is not None and self._deliver_acks(pair, names, patient=patient):
                del self._unacked[(offset.id, offset.seq, name)]
                recent = self._recent.setdefault(name, [])
                recent.extend(names)
                del recent[:-RECENT_ACKS]
            elif patient:
                log.warning("kapok source: batch %d's ack on pair %s is tried again later", offset.seq, name)
        self._acked[(offset.id, offset.seq)] = None
        while len(self._acked) > RECENT_ACKS:
            self._acked.popitem(last=False)

    def _retry_acks(self, pairs: dict[str, Pair]) -> None:
        for (ident, seq, name), names in list(self._unacked.items()):
            pair = pairs.get(name)
            if pair is not None and self._deliver_acks(pair, names, patient=False):
                del self._unacked[(ident, seq, name)]

    def _deliver_acks(self, pair: Pair, names: list[str], *, patient: bool) -> bool:
        """Ack ``names`` on ``pair``; with ``patient`` through a takeover (backing off up to
        the bound), else one round over the pair's nodes. True once delivered."""
        opts = self.options

        def ack(node: NodeClient) -> None:
            for claim in names:
                node.ack_claim(opts.topic, opts.group, claim)

        bound_s = opts.bound_s if patient else 0.0
        try:
            on_pair(
                pair.urls, ack, key=opts.key, timeout_s=opts.timeout_s, bound_s=bound_s,
                what=f"ack on pair {pair.name}",
            )  # fmt: skip
        except AnalyticsError as exc:
            log.info("%s", exc)
            return False
        return True


def register(spark: SparkSession) -> None:
    """Make ``format("kapok")`` known to ``spark``."""
    spark.dataSource.register(KapokStreamSource)
