"""The Kapok client library: ``Producer`` and ``Consumer`` for a Kapok cluster.

Both take one or more seed URLs (any node's HTTP base URL) and the secret key, read the
cluster's active members from ``/cluster/nodes`` and keep that view fresh. The producer
spreads batches over the masters (``balance="random"``, ``"p2c"`` or ``"key"``) and
retries failed batches without duplicates; the consumer subscribes on every active
master; a ``SessionPool`` lets producers and consumers share one connection per node.
``protocol="kapokmq"`` talks KapokMQ's protocol instead, to any KapokMQ-compatible
server. ``kapok.client.sync`` wraps both for code without an event loop.
"""

from kapok.client.backoff import backoff_delay
from kapok.client.balance import BALANCES
from kapok.client.consumer import Consumer, Message
from kapok.client.pool import SessionPool
from kapok.client.producer import Producer
from kapok.client.session import NodeSession, SubSpec
from kapok.client.stats import NodeStats, Stats, Status
from kapok.client.view import Member

__all__ = [
    "BALANCES",
    "Consumer",
    "Member",
    "Message",
    "NodeSession",
    "NodeStats",
    "Producer",
    "SessionPool",
    "Stats",
    "Status",
    "SubSpec",
    "backoff_delay",
]
