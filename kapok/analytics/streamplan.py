"""The stream source's pure parts: its options, its offsets, claims, and a batch's split.

An offset is small and bounded: ``{"id": <the source's id>, "seq": n, "pairs": {pair:
max count}}``, the id made once when the query first starts (its first offset), ``seq``
the batch's number, ``pairs`` the master pairs the batch reads and how many messages it
may take from each. Nothing in it grows with the messages. A batch's messages on a pair
are those leased under its **claims** (``claims``): names derived from the offset alone,
so a batch replayed after a restart, or a task tried again, asks each node for the very
same claims and gets the very same messages.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from kapok.analytics.pull import MAX_PULL
from kapok.errors import AnalyticsError

__all__ = ["Offset", "StreamOptions", "claims", "split_limit"]

DEFAULT_GROUP: Final = "default"
RETRY_TIMEOUTS: Final = 4  # a pair may take this many timeoutSeconds to serve again (takeover)
POSITIONS: Final = ("latest", "earliest")
_NAMES: Final = {  # lower case (Spark's options are case-insensitive) -> the documented name
    name.lower(): name
    for name in (
        "seeds", "url", "topic", "group", "startingPosition", "maxMessagesPerBatch", "key",
        "leaseSeconds", "timeoutSeconds", "numPartitions",
    )
}  # fmt: skip

_N = TypeVar("_N", int, float)


def _positive(name: str, raw: str, kind: type[_N]) -> _N:
    try:
        value = kind(raw)
    except ValueError:
        raise AnalyticsError(f"the kapok source: option {name} must be a number, got {raw!r}") from None
    if not value > 0 or value != value:
        raise AnalyticsError(f"the kapok source: option {name} must be positive, got {raw!r}")
    return value


def _seeds(raw: str) -> tuple[str, ...]:
    seeds = tuple(dict.fromkeys(s.strip().rstrip("/") for s in raw.split(",") if s.strip()))
    bad = [s for s in seeds if not s.startswith(("http://", "https://"))]
    if bad:
        raise AnalyticsError(
            f"the kapok source: a seed is a node's http(s) URL such as http://127.0.0.1:8011, got {bad[0]!r}"
        )
    return seeds


@dataclass(frozen=True, slots=True)
class StreamOptions:
    seeds: tuple[str, ...]
    topic: str
    group: str = DEFAULT_GROUP
    start: str = "latest"
    key: str = "test"
    max_per_batch: int = 1000
    lease_s: float = 600.0
    timeout_s: float = 30.0

    @property
    def bound_s(self) -> float:
        """How long a batch's fetch or ack may try a pair before it gives up."""
        return RETRY_TIMEOUTS * self.timeout_s

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        given = {str(name).lower(): str(value) for name, value in options.items()}
        unknown = sorted(name for name in given if name not in _NAMES)
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(_NAMES), n=1)
            hint = f" (did you mean {_NAMES[close[0]]}?)" if close else ""
            raise AnalyticsError(
                f"the kapok source: unknown option {unknown[0]}{hint}; it takes {', '.join(_NAMES.values())}"
            )
        seeds = _seeds(",".join(given[name] for name in ("seeds", "url") if given.get(name)))
        topic = given.get("topic", "")
        if not seeds or not topic:
            missing = [name for name, ok in (("seeds", seeds), ("topic", topic)) if not ok]
            raise AnalyticsError(f"the kapok source needs the option {' and '.join(missing)}")
        start = given.get("startingposition", "latest").strip().lower()
        if start not in POSITIONS:
            raise AnalyticsError(f"the kapok source: startingPosition is latest or earliest, got {start!r}")
        return cls(
            seeds=seeds,
            topic=topic,
            group=given.get("group") or DEFAULT_GROUP,
            start=start,
            key=given.get("key", "test"),
            max_per_batch=_positive("maxMessagesPerBatch", given.get("maxmessagesperbatch", "1000"), int),
            lease_s=_positive("leaseSeconds", given.get("leaseseconds", "600"), float),
            timeout_s=_positive("timeoutSeconds", given.get("timeoutseconds", "30"), float),
        )


@dataclass(frozen=True, slots=True)
class Offset:
    """A position of the stream (see the module's docstring); ``pairs`` sorted by name."""

    id: str
    seq: int = 0
    pairs: tuple[tuple[str, int], ...] = ()

    @classmethod
    def initial(cls) -> Offset:
        return cls(uuid.uuid4().hex)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "seq": self.seq, "pairs": dict(self.pairs)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Offset:
        """Spark's stored offset; a bad one fails without quoting it (it may be large)."""
        if "codes" in raw:
            raise AnalyticsError(
                "the kapok source: this checkpoint was written by an older kapok source "
                "(offsets with codes); start the query with a new checkpointLocation"
            )
        ident, seq, pairs = raw.get("id"), raw.get("seq"), raw.get("pairs")
        ok_pairs = isinstance(pairs, dict) and all(
            isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in pairs.items()
        )
        if not isinstance(ident, str) or not ident or not isinstance(seq, int) or not ok_pairs:
            raise AnalyticsError("the kapok source: an offset in the checkpoint is not one of this source")
        assert isinstance(pairs, dict)
        return cls(ident, seq, tuple(sorted(pairs.items())))

    def next(self, shares: Mapping[str, int]) -> Offset:
        """The offset of the batch after this one, reading ``shares``."""
        return Offset(self.id, self.seq + 1, tuple(sorted((k, v) for k, v in shares.items() if v > 0)))


def claims(offset: Offset, count: int) -> list[tuple[str, int]]:
    """The claims of ``offset``'s batch on a pair it may take ``count`` messages from:
    ``<id>.<seq>.<k>``, one per pull of up to ``MAX_PULL``, with how many each may take."""
    return [
        (f"{offset.id}.{offset.seq}.{k}", min(MAX_PULL, count - i))
        for k, i in enumerate(range(0, count, MAX_PULL))
    ]


def split_limit(limit: int, ready: Mapping[str, int]) -> dict[str, int]:
    """Share ``limit`` messages among pairs with ``ready`` messages: each gets what it has
    when that is at most its fair share, the rest is shared evenly among the others (ties
    by name). Pairs with nothing ready get nothing."""
    pending = sorted((name for name, n in ready.items() if n > 0), key=lambda name: (ready[name], name))
    out: dict[str, int] = {}
    left = max(0, limit)
    while pending and left > 0:
        fair, extra = divmod(left, len(pending))
        name = pending[0]
        if ready[name] <= fair:
            out[name] = ready[name]
            left -= ready[name]
            pending.pop(0)
            continue
        for i, other in enumerate(sorted(pending)):
            out[other] = fair + (1 if i < extra else 0)
        break
    return {name: n for name, n in out.items() if n > 0}
