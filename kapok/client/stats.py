"""What a producer or consumer reports about itself: a status and counters."""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["NodeStats", "Stats", "Status"]


class Status(enum.Enum):
    NEW = "new"  # created, not started
    CONNECTING = "connecting"  # first discovery and connections under way
    CONNECTED = "connected"  # at least one active node is taking work
    RECONNECTING = "reconnecting"  # no node takes work at the moment; retrying with backoff
    CLOSED = "closed"


@dataclasses.dataclass
class NodeStats:
    """Counters of one node (by member name; a slave that took over has its own row)."""

    sent: int = 0  # messages written to this node (a retry counts again)
    confirmed: int = 0  # producer: acknowledged by this node
    received: int = 0  # consumer: delivered by this node
    retried: int = 0  # messages sent here again after a failure elsewhere or here
    connects: int = 0  # connections opened
    failures: int = 0  # connections that failed or broke


@dataclasses.dataclass
class Stats:
    """Totals; ``per_node`` breaks them down by member name."""

    sent: int = 0  # producer: messages handed to ``send``/``publish``
    confirmed: int = 0  # producer: messages a node confirmed
    retried: int = 0  # producer: messages sent again after a failure
    failed: int = 0  # producer: messages whose publish raised
    received: int = 0  # consumer: messages delivered to this consumer
    acked: int = 0
    nacked: int = 0
    dropped: int = 0  # consumer: messages the full buffer could not take (requeued or lost)
    server_errors: int = 0  # error frames that answered no request (e.g. an unknown code in an ack)
    per_node: dict[str, NodeStats] = dataclasses.field(default_factory=dict)

    def node(self, name: str) -> NodeStats:
        stats = self.per_node.get(name)
        if stats is None:
            stats = self.per_node[name] = NodeStats()
        return stats
