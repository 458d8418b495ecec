"""The settings the broker's rules read, as plain frozen values.

The core has settings types of its own so that it imports nothing of the
configuration loader (YAML, environment variables, the other sections):
``kapok.config`` builds a ``BrokerSettings`` from the ``mq`` section
(``MqConfig.settings()``), and tests may build one directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BrokerSettings", "TopicSettings"]


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """The effective settings of one topic (the mq defaults merged with its override)."""

    push_type: int  # 1 = p2p (one shared group), 2 = pub/sub (a group per consumer)
    ack_timeout_s: float  # seconds before an unacked delivery is retried
    max_deliveries: int  # attempts before dead-lettering, 0 = unlimited
    max_length: int  # messages held, 0 = unlimited
    max_bytes: int  # payload bytes held, 0 = unlimited
    overflow: str  # "reject" | "drop_oldest"
    ttl_s: float  # default message TTL, seconds, 0 = none
    retain_consumed_s: float  # seconds a consumed message is kept


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Node-wide limits and defaults of the broker (units in the names, as in the config)."""

    topic_defaults: TopicSettings
    prefetch: int  # unacked messages out to one consumer, unless it asks for another number
    max_message_bytes: int
    dedup_window_s: float
    dedup_max_entries: int
    expired: str  # "drop" | "dead_letter": the fate of a message whose TTL passed
    retain_consumed_max: int  # consumed messages kept for inspection, whole node
    producer_rate: float  # messages/s per producer, 0 = unlimited
    producer_burst: int
    max_prefetch: int = 1_000_000  # what a consumer asking for more prefetch gets
    max_backlog_bytes: int = 0  # node-wide live payload + MESSAGE_OVERHEAD_BYTES each; 0 = unlimited
    topic_overrides: Mapping[str, TopicSettings] = field(default_factory=dict)  # by exact topic name

    def topic(self, name: str) -> TopicSettings:
        return self.topic_overrides.get(name, self.topic_defaults)
