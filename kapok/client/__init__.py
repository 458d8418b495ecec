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
from kapok.client.base import ClientOptions, WireProtocol
from kapok.client.consumer import Consumer
from kapok.client.consumer_state import MessageHandler
from kapok.client.message import Message, Processing
from kapok.client.pool import SessionPool
from kapok.client.producer import Balance, Producer
from kapok.client.session import AckMode, NodeSession, SubSpec
from kapok.client.stats import NodeStats, Stats, Status
from kapok.client.view import Member

__all__ = [
    "BALANCES",
    "AckMode",
    "Balance",
    "ClientOptions",
    "Consumer",
    "Member",
    "Message",
    "MessageHandler",
    "NodeSession",
    "NodeStats",
    "Processing",
    "Producer",
    "SessionPool",
    "Stats",
    "Status",
    "SubSpec",
    "WireProtocol",
    "backoff_delay",
]
