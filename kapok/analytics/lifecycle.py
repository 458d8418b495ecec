"""A message's life per group, from the one shuffle by code: backlog and the latency split.

Pure functions DataFrame → DataFrame, used by ``kapok.analytics.job``; the rules are
stated in ``kapok.analytics.transforms`` ("Per group" and "Latency split"). The steps:

* ``messages``: one row per code (the one shuffle over the events): the message's
  topic, creation time, due time (creation + its delay), delete time, and its events
  that name a group (``delivered``, ``retried`` and the ends), as a list.
* ``group_starts``: per topic × group, the time of its first event (a small aggregate).
* ``entries``: one row per entry (a message in a group): every group the message has an
  event in, and every other group of its topic whose first event is not later than the
  message's creation (assumed to have the message ready: a ``published`` event names no
  group). An entry's events run through a small state machine (``_walk``), in Spark's
  own expressions: its state changes (ready ±1, in flight ±1 at a time), when it began
  and ended being unacked, its first delivery, its ack and the delivery the ack ended.
* ``durations``: end-to-end latency, queue wait and processing per entry, and the
  intentional delay per message, as rows ``topic``, window, ``metric``, ``value_ms``.
* ``backlog``: per topic × group × window, ready and in flight at the window's end
  (running sums of the state changes) and the age of the oldest unacked entry.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "DURATION_METRICS",
    "GROUP_KINDS",
    "backlog",
    "durations",
    "entries",
    "group_starts",
    "messages",
    "window_start",
]

# Events that name a group: an entry's life.
GROUP_KINDS: Final = ("delivered", "retried", "acked", "dead_lettered", "expired", "requeued", "dropped")
# The durations measured, in milliseconds (``durations``'s ``metric``).
DURATION_METRICS: Final = ("latency", "queue_wait", "processing", "delay")

# Step kinds of an entry's walk, in the order of a tie at one instant.
_DUE, _DELIVERED, _RETRIED, _END, _DELETED = 0, 1, 2, 3, 4
# States: not known yet, ready, in flight, gone.
_UNKNOWN, _READY, _IN_FLIGHT, _GONE = 0, 1, 2, 3
_LAST: Final = 1e12  # an order after every attempt


def window_start(t: Column, window_s: int) -> Column:
    """The unix time (seconds) of the start of ``t``'s window."""
    return F.floor(t / F.lit(window_s)) * F.lit(window_s)


def _is(kind: str) -> Column:
    return F.col("ev") == F.lit(kind)


def messages(events: DataFrame) -> DataFrame:
    """One row per code: ``topic``, ``created``, ``due``, ``deleted_t``, ``steps``.

    ``steps`` are the events that name a group as ``(t, order, kind, group, ack)``; ``order``
    breaks ties at one instant: a delivery before the requeue of the same attempt, that
    requeue before the next attempt's delivery, the ends after both.
    """
    kind = (
        F.when(_is("delivered"), F.lit(_DELIVERED))
        .when(_is("retried"), F.lit(_RETRIED))
        .otherwise(F.lit(_END))
    )
    attempt = F.coalesce(F.col("attempt"), F.lit(0)).cast("double")
    order = (
        F.when(_is("delivered"), attempt * 2).when(_is("retried"), attempt * 2 + 1).otherwise(F.lit(_LAST))
    )
    step = F.struct(
        F.col("t").alias("t"),
        order.alias("order"),
        kind.alias("kind"),
        F.col("group").alias("group"),
        _is("acked").alias("ack"),
    )
    named = F.col("ev").isin(*GROUP_KINDS) & F.col("group").isNotNull()
    created = F.min(F.when(_is("published"), F.col("create_time")))
    deliver_at = F.min(F.when(_is("published"), F.col("deliver_at")))
    return (
        events.where(F.col("code").isNotNull() & F.col("topic").isNotNull())
        .groupBy("code")
        .agg(
            F.min_by("topic", F.when(_is("published"), 0).otherwise(1)).alias("topic"),
            created.alias("created"),
            deliver_at.alias("deliver_at"),
            F.min(F.when(_is("deleted"), F.col("t"))).alias("deleted_t"),
            F.collect_list(F.when(named, step)).alias("steps"),  # nulls left out
        )
        .select(
            "code",
            "topic",
            "created",
            F.when(F.col("deliver_at") > F.col("created"), F.col("deliver_at") - F.col("created")).alias(
                "delay_s"
            ),
            "deleted_t",
            "steps",
        )
        .withColumn("due", F.col("created") + F.coalesce(F.col("delay_s"), F.lit(0.0)))
    )


def group_starts(msgs: DataFrame) -> DataFrame:
    """Per topic × group: ``start``, the time of the group's first event."""
    return (
        msgs.select("topic", F.explode("steps").alias("s"))
        .groupBy("topic", F.col("s.group").alias("group"))
        .agg(F.min("s.t").alias("start"))
    )


def entries(msgs: DataFrame, starts: DataFrame) -> DataFrame:
    """One row per entry: ``topic``, ``group``, ``created``, ``due``, and its walk's results:
    ``changes`` (``t``, ``ready``, ``in_flight``: −1, 0 or +1 each), ``began``, ``ended``
    (unacked from … to; ``ended`` null while it still is), ``first_delivery``, ``acked``,
    ``acked_delivery``."""
    touched = F.array_distinct(F.transform("steps", lambda s: s["group"]))
    assumed = F.col("created").isNotNull() & (F.col("start") <= F.col("created"))
    pairs = (
        msgs.withColumn("touched", touched)
        .join(F.broadcast(starts), "topic")
        .where(F.array_contains("touched", F.col("group")) | assumed)
    )
    no_step = F.lit(None).cast("struct<t:double,order:double,kind:int,group:string,ack:boolean>")

    def extra(kind: int, t: Column) -> Column:
        return F.when(
            t.isNotNull(),
            F.struct(
                t.alias("t"),
                F.lit(_LAST * 2 if kind == _DELETED else -1.0).alias("order"),
                F.lit(kind).alias("kind"),
                F.col("group").alias("group"),
                F.lit(False).alias("ack"),
            ),
        ).otherwise(no_step)

    own = F.filter("steps", lambda s: s["group"] == F.col("group"))
    walk_steps = F.array_sort(
        F.filter(
            F.concat(own, F.array(extra(_DUE, F.col("due")), extra(_DELETED, F.col("deleted_t")))),
            lambda s: s.isNotNull(),
        )
    )
    return pairs.select("topic", "group", "created", "due", _walk(walk_steps).alias("w")).select(
        "topic", "group", "created", "due", "w.*"
    )


def _walk(steps: Column) -> Column:
    """The entry's state machine over its sorted steps (module docstring)."""
    change_type = "array<struct<t:double,ready:int,in_flight:int>>"
    init = F.struct(
        F.lit(_UNKNOWN).alias("state"),
        F.array().cast(change_type).alias("changes"),
        F.lit(None).cast("double").alias("began"),
        F.lit(None).cast("double").alias("ended"),
        F.lit(None).cast("double").alias("first_delivery"),
        F.lit(None).cast("double").alias("last_delivery"),
        F.lit(None).cast("double").alias("acked"),
        F.lit(None).cast("double").alias("acked_delivery"),
    )

    def step(acc: Column, s: Column) -> Column:
        state, kind, t = acc["state"], s["kind"], s["t"]
        live = state != F.lit(_GONE)
        new = (
            F.when(~live, F.lit(_GONE))
            .when(kind == _DUE, F.when(state == _UNKNOWN, F.lit(_READY)).otherwise(state))
            .when(kind == _DELIVERED, F.lit(_IN_FLIGHT))
            .when(kind == _RETRIED, F.lit(_READY))
            .otherwise(F.lit(_GONE))
        )
        change = F.struct(
            t.alias("t"),
            ((new == _READY).cast("int") - (state == _READY).cast("int")).alias("ready"),
            ((new == _IN_FLIGHT).cast("int") - (state == _IN_FLIGHT).cast("int")).alias("in_flight"),
        )
        delivery = live & (kind == _DELIVERED)
        ack = live & s["ack"]
        unacked = (state == _READY) | (state == _IN_FLIGHT)
        return F.struct(
            new.alias("state"),
            F.when(new != state, F.concat(acc["changes"], F.array(change)))
            .otherwise(acc["changes"])
            .alias("changes"),
            F.coalesce(acc["began"], F.when((new == _READY) | (new == _IN_FLIGHT), t)).alias("began"),
            F.when(unacked & (new == _GONE), t).otherwise(acc["ended"]).alias("ended"),
            F.coalesce(acc["first_delivery"], F.when(delivery, t)).alias("first_delivery"),
            F.when(delivery, t).otherwise(acc["last_delivery"]).alias("last_delivery"),
            F.when(ack, t).otherwise(acc["acked"]).alias("acked"),
            F.when(ack, acc["last_delivery"]).otherwise(acc["acked_delivery"]).alias("acked_delivery"),
        )

    return F.aggregate(steps, init, step)


def durations(entry_rows: DataFrame, msgs: DataFrame, window_s: int, since_t: float | None) -> DataFrame:
    """Rows ``topic``, ``window_t`` (unix s), ``metric``, ``value_ms``: per entry its end-to-end
    ``latency`` (ack − creation) and ``processing`` (ack − the acked delivery) in the window of
    the ack, its ``queue_wait`` (first delivery − due) in the window of the first delivery;
    per delayed message its ``delay`` in the window of its creation. Only those at or after
    ``since_t``."""

    def item(metric: str, at: Column, start: Column) -> Column:
        value = F.when(at.isNotNull() & start.isNotNull(), (at - start) * 1000.0)
        return F.struct(F.lit(metric).alias("metric"), at.alias("at"), value.alias("value_ms"))

    per_entry = entry_rows.select(
        "topic",
        F.explode(
            F.array(
                item("latency", F.col("acked"), F.col("created")),
                item("processing", F.col("acked"), F.col("acked_delivery")),
                item("queue_wait", F.col("first_delivery"), F.col("due")),
            )
        ).alias("d"),
    )
    delays = msgs.where(F.col("delay_s").isNotNull()).select(
        "topic", item("delay", F.col("created"), F.col("created") - F.col("delay_s")).alias("d")
    )
    rows = per_entry.unionByName(delays).where(F.col("d.value_ms").isNotNull())
    if since_t is not None:
        rows = rows.where(F.col("d.at") >= F.lit(since_t))
    return rows.select(
        "topic",
        window_start(F.col("d.at"), window_s).alias("window_t"),
        F.col("d.metric").alias("metric"),
        F.col("d.value_ms").alias("value_ms"),
    )


def backlog(entry_rows: DataFrame, window_s: int, windows: DataFrame | None = None) -> DataFrame:
    """Per topic × group × window (``window_t``, unix s) in which an entry of the group
    changed state or stayed unacked across the window's end, or that ``windows`` (``topic``,
    ``group``, ``window_t``) names: ``ready`` and ``in_flight`` at the window's end, and
    ``oldest_unacked_age_s`` (null when nothing is unacked).

    An entry counts as unacked at the end ``E`` of a window when it began before ``E`` and
    ended at or after it (or not at all); its age is ``E`` − its due time (its first known
    step when its ``published`` event is not in the input).
    """
    w = F.lit(window_s)
    since = F.coalesce(F.col("due"), F.col("began"))
    changes = entry_rows.select("topic", "group", F.explode("changes").alias("c")).select(
        "topic",
        "group",
        window_start(F.col("c.t"), window_s).alias("window_t"),
        F.col("c.ready").alias("ready"),
        F.col("c.in_flight").alias("in_flight"),
        F.lit(None).cast("double").alias("open_since"),
        F.lit(None).cast("double").alias("closed_since"),
    )
    unacked = entry_rows.where(F.col("began").isNotNull())
    # Still unacked at the input's end: unacked at every window end after it began.
    still = unacked.where(F.col("ended").isNull()).select(
        "topic",
        "group",
        window_start(F.col("began"), window_s).alias("window_t"),
        F.lit(0).alias("ready"),
        F.lit(0).alias("in_flight"),
        since.alias("open_since"),
        F.lit(None).cast("double").alias("closed_since"),
    )
    # Ended: unacked at the ends of the windows from its first one to the one before its end.
    first = F.floor(F.col("began") / w)
    last = F.floor(F.col("ended") / w) - 1
    crossed = (
        unacked.where(F.col("ended").isNotNull() & (last >= first))
        .select("topic", "group", since.alias("since"), F.explode(F.sequence(first, last)).alias("n"))
        .select(
            "topic",
            "group",
            (F.col("n") * w).alias("window_t"),
            F.lit(0).alias("ready"),
            F.lit(0).alias("in_flight"),
            F.lit(None).cast("double").alias("open_since"),
            F.col("since").alias("closed_since"),
        )
    )
    rows = changes.unionByName(still).unionByName(crossed)
    if windows is not None:
        rows = rows.unionByName(
            windows.select(
                "topic",
                "group",
                "window_t",
                F.lit(0).alias("ready"),
                F.lit(0).alias("in_flight"),
                F.lit(None).cast("double").alias("open_since"),
                F.lit(None).cast("double").alias("closed_since"),
            )
        )
    per_window = rows.groupBy("topic", "group", "window_t").agg(
        F.sum("ready").alias("d_ready"),
        F.sum("in_flight").alias("d_in_flight"),
        F.min("open_since").alias("open_since"),
        F.min("closed_since").alias("closed_since"),
    )
    upto = Window.partitionBy("topic", "group").orderBy("window_t").rowsBetween(Window.unboundedPreceding, 0)
    oldest = F.least(F.min("open_since").over(upto), F.col("closed_since"))
    return per_window.select(
        "topic",
        "group",
        "window_t",
        F.sum("d_ready").over(upto).cast("long").alias("ready"),
        F.sum("d_in_flight").over(upto).cast("long").alias("in_flight"),
        (F.col("window_t") + w - oldest).alias("oldest_unacked_age_s"),
    )
