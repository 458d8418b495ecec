"""A Kapok topic as a Spark Structured Streaming source: ``spark.readStream.format("kapok")``.

::

    from kapok.analytics.stream import register
    register(spark)
    df = (spark.readStream.format("kapok").option("url", "http://127.0.0.1:8011")
          .option("topic", "orders").option("group", "spark").load())

Theory of operation. Kapok is a queue, not a log: there is no offset to seek to, only
messages leased to a group (``GET /v1/topics/{t}/messages``) and acked by code. So
the source makes the *checkpoint* the log: a batch's end offset carries the codes of
the batch's messages (``{"seq": n, "codes": "c1,c2,…"}``), and Spark writes that
offset to its checkpoint before the batch runs.

* ``latestOffset`` (driver) leases up to the read limit (``maxMessagesPerBatch``) and
  returns an offset naming them; the messages' data stay in this reader's memory.
* ``partitions`` hands the data to the tasks inside the partitions. When it has no
  data for a code (the query restarted, and Spark replays a batch from the
  checkpoint), the task reads that message by code (``GET /v1/messages/{code}``): a
  replayed batch holds exactly the messages it held the first time.
* ``commit`` (after Spark committed the batch) acks the batch's codes. Nothing is
  acked earlier, and the start offset of every later call is acked too (idempotent),
  which covers a crash between Spark's commit and ours.

So a restarted query re-reads what was not committed, and nothing committed is read
twice (with a sink that is exactly-once per batch, such as the file sink or an
idempotent ``foreachBatch``). The one condition: a batch must be committed within
its lease (``leaseSeconds``, default 600 s, counted from the pull); a message whose
lease ends first is delivered again by the node (counting toward
``mq.max_deliveries``). A pull that brings back a code still held, or just acked, is
dropped (and the latter acked again), so such a re-delivery is not read twice
either while this reader runs. Messages leased for an offset that Spark never
logged (the query stopped in between) return to the group when their lease ends.

``Trigger.AvailableNow`` reads what the group has ready when the query starts (its
``ready`` count), in batches of ``maxMessagesPerBatch``, then stops.

Options: ``url`` (required), ``topic`` (required), ``group`` (default ``default``, the
group of a p2p topic's plain consumers; a new group is created by the first read),
``key`` (the secret key, default ``test``), ``maxMessagesPerBatch`` (1000),
``leaseSeconds`` (600), ``numPartitions`` (2), ``timeoutSeconds`` (30, per HTTP request).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from kapok.analytics.pull import MAX_PULL, NodeClient, message_row
from kapok.errors import AnalyticsError

__all__ = ["SCHEMA", "KapokStreamReader", "KapokStreamSource", "StreamOptions", "register"]

log = logging.getLogger("kapok.analytics")

SCHEMA: Final = (
    "code STRING, topic STRING, key STRING, priority INT, data BINARY, create_time TIMESTAMP, "
    "attempts INT, headers MAP<STRING, STRING>"
)
DEFAULT_GROUP: Final = "default"
ACKED_MEMORY: Final = 100_000  # codes remembered after their ack, to drop a late re-delivery
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class StreamOptions:
    url: str
    topic: str
    group: str
    key: str = "test"
    max_per_batch: int = 1000
    lease_s: float = 600.0
    partitions: int = 2
    timeout_s: float = 30.0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        missing = [name for name in ("url", "topic") if not options.get(name)]
        if missing:
            raise AnalyticsError(f"the kapok source needs the option(s) {', '.join(missing)}")
        try:
            return cls(
                url=options["url"].rstrip("/"),
                topic=options["topic"],
                group=options.get("group") or DEFAULT_GROUP,
                key=options.get("key", "test"),
                max_per_batch=_positive(int(options.get("maxMessagesPerBatch", "1000"))),
                lease_s=_positive(float(options.get("leaseSeconds", "600"))),
                partitions=_positive(int(options.get("numPartitions", "2"))),
                timeout_s=_positive(float(options.get("timeoutSeconds", "30"))),
            )
        except ValueError as exc:
            raise AnalyticsError(f"the kapok source: bad option value ({exc})") from None

    def client(self) -> NodeClient:
        return NodeClient(self.url, self.key, self.timeout_s)


_N = TypeVar("_N", int, float)


def _positive(value: _N) -> _N:
    if value <= 0:
        raise ValueError(f"{value} is not positive")
    return value


def offset_codes(offset: Mapping[str, Any]) -> list[str]:
    codes = str(offset.get("codes", ""))
    return codes.split(",") if codes else []


class KapokPartition(InputPartition):
    """Messages of one task, in order: each with its row, or None to read it by code."""

    def __init__(self, items: list[tuple[str, Row | None]]) -> None:
        self.items = items


class KapokStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kapok"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KapokStreamReader(StreamOptions.parse(self.options))


class KapokStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One per query run, in Spark's planner process (``read`` runs in the tasks)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        # Leased and not yet acked, in lease order; the row, or None when known by code only.
        self._held: dict[str, Row | None] = {}
        self._acked: OrderedDict[str, None] = OrderedDict()
        self._budget: int | None = None  # AvailableNow: how many more may be leased

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "codes": ""}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        with self.options.client() as node:
            ready = node.ready_count(self.options.topic, self.options.group)
            if ready is None:  # a new group: a first pull creates it (it gets what comes after)
                self._lease(node, 1)
            self._budget = ready or 0

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        start = start if start is not None else self.initialOffset()
        want = self.options.max_per_batch
        if isinstance(limit, ReadMaxRows):
            want = min(want, max(limit.max_rows, 1))
        with self.options.client() as node:
            self._ack(node, offset_codes(start), reporting=False)  # Spark committed ``start``
            if len(self._held) < want:
                self._lease(node, want - len(self._held))
        if not self._held:
            return start
        codes = list(self._held)[:want]
        return {"seq": int(start.get("seq", 0)) + len(codes), "codes": ",".join(codes)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        with self.options.client() as node:
            self._ack(node, offset_codes(start), reporting=False)
        items: list[tuple[str, Row | None]] = []
        for code in offset_codes(end):
            row = self._held.setdefault(code, None)  # a replayed batch's codes are ours too
            items.append((code, row))
        parts = min(self.options.partitions, len(items))
        size = -(-len(items) // parts) if parts else 0
        return [KapokPartition(items[i : i + size]) for i in range(0, len(items), size)] if size else []

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, KapokPartition)
        node: NodeClient | None = None
        try:
            for code, row in partition.items:
                if row is None:
                    node = node or self.options.client()
                    row = node.message_row(code, self.options.group)
                    if row is None:  # deleted (console) since the batch was planned
                        log.warning(
                            "kapok source: message %s is gone; its batch is replayed without it", code
                        )
                        continue
                yield row
        finally:
            if node is not None:
                node.close()

    def commit(self, end: dict[str, Any]) -> None:
        with self.options.client() as node:
            self._ack(node, offset_codes(end), reporting=True)

    # -- internals ---------------------------------------------------------------------

    def _lease(self, node: NodeClient, count: int) -> None:
        if self._budget is not None:
            count = min(count, self._budget)
        again: list[str] = []
        while count > 0:
            asked = min(count, MAX_PULL)
            messages = node.pull(self.options.topic, self.options.group, asked, self.options.lease_s)
            if self._budget is not None:
                self._budget -= len(messages)
            for message in messages:
                code = message["code"]
                if code in self._acked:
                    again.append(code)  # our ack was lost (its lease had ended): settle it now
                elif code not in self._held:
                    self._held[code] = message_row(message)
                    count -= 1
            if len(messages) < asked or (self._budget is not None and self._budget <= 0):
                break  # the group has nothing more ready (or AvailableNow has its share)
        if again:
            node.ack(self.options.topic, self.options.group, again)

    def _ack(self, node: NodeClient, codes: list[str], *, reporting: bool) -> None:
        todo = [code for code in codes if code not in self._acked]
        if not todo:
            return
        unknown = node.ack(self.options.topic, self.options.group, todo)
        if unknown and reporting:
            log.warning(
                "kapok source: %d of %d messages were no longer leased when their batch was committed "
                "(lease ended: raise leaseSeconds); the node may deliver them again",
                len(unknown),
                len(todo),
            )
        for code in todo:
            self._held.pop(code, None)
            self._acked[code] = None
        while len(self._acked) > ACKED_MEMORY:
            self._acked.popitem(last=False)


def register(spark: SparkSession) -> None:
    """Make ``format("kapok")`` known to ``spark``."""
    spark.dataSource.register(KapokStreamSource)
