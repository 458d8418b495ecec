"""The common message's figures, in arrays: no walk of its life one event at a time.

Most messages live the shortest life there is: published (not delayed), delivered once to
one group, acked by that group, in that order, and their topic has no other group that
had started by then. ``lifecycle.Lives`` would walk each of them through the same three
state changes; here they are found and figured for all of them at once with numpy, the
same figures to the bit:

* the backlog changes of the entry: ready +1 in the window of its creation, ready −1 and
  in flight +1 in the window of its delivery, in flight −1 in the window of its ack; and
  for every window from its creation's to the one before its ack's, its creation time
  as a candidate oldest unacked (``BacklogParts``' last item);
* its durations: latency and processing in the window of the ack, queue wait in the
  window of the delivery (the due time is the creation: not delayed), at or after
  ``since_t``;
* carried to a later run (``carry_t``): its events before ``carry_t`` when it was acked at
  or after ``carry_t``.

Every other message (retried, dead-lettered, delayed, deleted, of several groups, …) is
left to the walk (``rest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Common", "common"]

_KINDS: Final = pa.array(["acked", "delivered", "published"])  # a code's rows sorted by ``ev``
_I64: Final = np.int64


@dataclass(frozen=True, slots=True)
class Common:
    """What ``common`` found: backlog parts per (topic, group, window_t) as ``[ready change,
    in-flight change, None, oldest creation unacked at the window's end]``; durations per
    (topic, metric) as (windows, values in ms); the rows (of ``ordered``) to carry; the rest."""

    parts: dict[tuple[str, str, int], list[Any]]
    values: dict[tuple[str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]
    carried: np.ndarray[Any, np.dtype[np.int64]]
    rest: pa.Table


def _floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray[Any, np.dtype[np.float64]]:
    """A column as floats, null as NaN."""
    return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def _windows(t: np.ndarray[Any, Any], window_s: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.floor(t / window_s).astype(_I64) * window_s


def common(
    ordered: pa.Table,
    *,
    starts: Mapping[str, Mapping[str, float]],
    window_s: int,
    since_t: float | None,
    carry_t: float | None,
) -> Common:
    """The common messages of ``ordered`` (events with a code and a topic, sorted by code,
    then ``ev``) and their figures; ``starts`` as ``Lives`` takes them."""
    n = ordered.num_rows
    empty = Common({}, {}, np.zeros(0, _I64), ordered)
    if n < 3:
        return empty
    codes = ordered["code"].combine_chunks()
    cut = np.flatnonzero(np.asarray(pc.not_equal(codes[1:], codes[:-1]).to_numpy(zero_copy_only=False))) + 1
    first = np.concatenate([[0], cut]).astype(_I64)
    size = np.diff(np.concatenate([first, [n]]))
    at = first[size == 3]  # a code of three events: acked, delivered, published?
    kind = np.asarray(pc.fill_null(pc.index_in(ordered["ev"], value_set=_KINDS), -1).to_numpy(), dtype=_I64)
    at = at[(kind[at] == 0) & (kind[at + 1] == 1) & (kind[at + 2] == 2)]
    groups = ordered["group"]
    same = pc.fill_null(pc.equal(groups.take(at), groups.take(at + 1)), False)
    at = at[np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)]
    t = _floats(ordered["t"])
    created = _floats(ordered["create_time"].take(at + 2))
    deliver_at = _floats(ordered["deliver_at"].take(at + 2))
    attempt = np.asarray(pc.fill_null(ordered["attempt"].take(at + 1), 0).to_numpy(), dtype=_I64)
    t_d, t_a = t[at + 1], t[at]
    # In this order (a delivery's attempt ≥ 0 sorts it after a due time at the same instant).
    ok = ~np.isnan(created) & ~(deliver_at > created) & (created <= t_d) & (t_d <= t_a) & (attempt >= 0)
    at, created, t_d, t_a = at[ok], created[ok], t_d[ok], t_a[ok]
    # Its entries: its group's, and no other group of its topic had started by its creation.
    topic_codes = pc.dictionary_encode(ordered["topic"].take(at + 2)).combine_chunks()
    group_codes = pc.dictionary_encode(groups.take(at)).combine_chunks()
    topic_names, group_names = topic_codes.dictionary.to_pylist(), group_codes.dictionary.to_pylist()
    ti = np.asarray(topic_codes.indices.to_numpy(zero_copy_only=False), dtype=_I64)
    gi = np.asarray(group_codes.indices.to_numpy(zero_copy_only=False), dtype=_I64)
    known = np.zeros((len(topic_names), len(group_names)), dtype=bool)
    others = np.full((len(topic_names), len(group_names)), np.inf)  # the earliest other group's start
    for i, topic in enumerate(topic_names):
        mine = starts.get(topic, {})
        for j, group in enumerate(group_names):
            known[i, j] = group in mine
            others[i, j] = min((s for g, s in mine.items() if g != group), default=np.inf)
    ok = known[ti, gi] & (others[ti, gi] > created)
    at, created, t_d, t_a, ti, gi = at[ok], created[ok], t_d[ok], t_a[ok], ti[ok], gi[ok]
    if len(at) == 0:
        return empty
    rest = np.ones(n, dtype=bool)
    rest[at] = rest[at + 1] = rest[at + 2] = False
    return Common(
        _parts(ti, gi, created, t_d, t_a, window_s, topic_names, group_names),
        _values(ti, created, t_d, t_a, window_s, since_t, topic_names),
        _carried(at, t, t_a, carry_t),
        ordered.filter(pa.array(rest)),
    )


def _parts(
    ti: np.ndarray[Any, Any],
    gi: np.ndarray[Any, Any],
    created: np.ndarray[Any, Any],
    t_d: np.ndarray[Any, Any],
    t_a: np.ndarray[Any, Any],
    window_s: int,
    topics: list[str],
    groups: list[str],
) -> dict[tuple[str, str, int], list[Any]]:
    w_c, w_d, w_a = (_windows(x, window_s) for x in (created, t_d, t_a))
    m = len(ti)
    one, zero = np.ones(m, _I64), np.zeros(m, _I64)
    changes = (
        pa.table(
            {
                "ti": np.concatenate([ti, ti, ti]),
                "gi": np.concatenate([gi, gi, gi]),
                "w": np.concatenate([w_c, w_d, w_a]),
                "ready": np.concatenate([one, -one, zero]),
                "in_flight": np.concatenate([zero, one, -one]),
            }
        )
        .group_by(["ti", "gi", "w"], use_threads=False)
        .aggregate([("ready", "sum"), ("in_flight", "sum")])
    )
    parts: dict[tuple[str, str, int], list[Any]] = {}
    for i, j, w, ready, in_flight in zip(
        *(changes[name].to_pylist() for name in ("ti", "gi", "w", "ready_sum", "in_flight_sum")), strict=True
    ):
        parts[(topics[i], groups[j], w)] = [ready, in_flight, None, None]
    # Unacked at the end of each window from its creation's to the one before its ack's.
    spans = (w_a - w_c) // window_s
    if spans.any():
        rows = np.repeat(np.arange(m), spans)
        step = np.arange(len(rows)) - np.repeat(np.cumsum(spans) - spans, spans)
        open_at = (
            pa.table(
                {"ti": ti[rows], "gi": gi[rows], "w": w_c[rows] + step * window_s, "since": created[rows]}
            )
            .group_by(["ti", "gi", "w"], use_threads=False)
            .aggregate([("since", "min")])
        )
        for i, j, w, since in zip(
            *(open_at[name].to_pylist() for name in ("ti", "gi", "w", "since_min")), strict=True
        ):
            part = parts.setdefault((topics[i], groups[j], w), [0, 0, None, None])
            part[3] = since if part[3] is None else min(part[3], since)
    return parts


def _values(
    ti: np.ndarray[Any, Any],
    created: np.ndarray[Any, Any],
    t_d: np.ndarray[Any, Any],
    t_a: np.ndarray[Any, Any],
    window_s: int,
    since_t: float | None,
    topics: list[str],
) -> dict[tuple[str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    out: dict[tuple[str, str], tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
    for metric, end, start in (
        ("latency", t_a, created),
        ("processing", t_a, t_d),
        ("queue_wait", t_d, created),
    ):
        keep = np.ones(len(end), dtype=bool) if since_t is None else end >= since_t
        windows, values, mine = _windows(end[keep], window_s), (end[keep] - start[keep]) * 1000.0, ti[keep]
        for i, topic in enumerate(topics):
            of = mine == i
            if of.any():
                out[(topic, metric)] = (windows[of], values[of])
    return out


def _carried(
    at: np.ndarray[Any, Any], t: np.ndarray[Any, Any], t_a: np.ndarray[Any, Any], carry_t: float | None
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The rows before ``carry_t`` of the messages acked at or after it."""
    if carry_t is None:
        return np.zeros(0, _I64)
    open_then = at[t_a >= carry_t]
    rows = np.concatenate([open_then, open_then + 1, open_then + 2])
    return np.sort(rows[t[rows] < carry_t])
