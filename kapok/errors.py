"""The one exception tree of Kapok.

Every error a client can see carries a machine-readable ``code`` and an HTTP
status; the server maps them to ``{"error": code, "message": ...}`` (v1), an
``error`` frame (native WebSocket) or ``{"code": -1, "msg": ...}`` (KapokMQ
compatibility routes), and the client maps ``code`` back to the same class::

    KapokError
     ├── ConfigError                  bad application.yaml / --set / env value
     ├── ProtocolError
     │    └── BadRequestError         malformed frame, form or JSON; wrong types
     │         ├── UnknownOpError     a frame with an ``op`` nobody knows
     │         └── MessageTooLargeError
     ├── AuthError                    missing or wrong secret key
     │    ├── CsrfError               a console form without its session's CSRF token
     │    └── AuthBlockedError        too many wrong keys from this address: wait (429)
     ├── TooManyConnectionsError      server.max_connections reached
     ├── BrokerError
     │    ├── QueueFullError          topic over max_length / max_bytes (policy reject)
     │    ├── RateLimitedError        producer over its token bucket
     │    ├── UnknownCodeError        ack / nack / touch of a code not held
     │    ├── NotFoundError           no such message, topic or group
     │    └── SubscriptionError       unknown subscription id, duplicate, bad group
     ├── UnavailableError             this node cannot take the request now (503)
     │    ├── NotActiveError          a passive slave: names the node to use instead
     │    ├── FencedError             a master cut off from its slave and the majority
     │    └── ReplicationUnavailableError  sync mode, the paired slave gone: nothing stored
     │         └── ReplicationUnconfirmedError  stored, but the slave did not confirm in time
     ├── ReplicationError             the sync link: a broken rule between master and slave
     │    └── SyncRefusedError        the master refused the slave (``why`` says why)
     ├── StorageError                 the disk: a failed write, an unreadable file, storage.dir in use
     │    └── StorageFullError        storage.dir (nearly) full: new messages refused (507), the rest goes on
     ├── AnalyticsError               ``kapok analytics``: unusable input, no Java, a failed Spark job
     └── ClientError                  raised by kapok.client itself, never sent by a node
          ├── ConnectionLostError     the connection to a node broke (in-flight work is in doubt)
          ├── SlowConsumerError       the consumer's buffer overflowed (messages requeued or dropped)
          ├── ClientClosedError       the producer or consumer was closed
          ├── UnsupportedError        not possible over the chosen protocol (KapokMQ mode)
          ├── ClusterUnavailableError no seed or known member answered with the cluster view
          └── PublishTimeoutError     no node confirmed a message within ``publish_timeout_s``

The last two are ``UnavailableError``s as well (the cluster cannot take the work now): an
``except UnavailableError`` catches the node's refusals and the client's own time-outs alike,
an ``except ClientError`` everything the client raises by itself. ``StorageFullError`` is one
too: the node refused the write before applying anything, so another node may take it.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AnalyticsError",
    "AuthBlockedError",
    "AuthError",
    "BadRequestError",
    "BrokerError",
    "ClientClosedError",
    "ClientError",
    "ClusterUnavailableError",
    "ConfigError",
    "ConnectionLostError",
    "CsrfError",
    "FencedError",
    "KapokError",
    "MessageTooLargeError",
    "NotActiveError",
    "NotFoundError",
    "ProtocolError",
    "PublishTimeoutError",
    "QueueFullError",
    "RateLimitedError",
    "ReplicationError",
    "ReplicationUnavailableError",
    "ReplicationUnconfirmedError",
    "SlowConsumerError",
    "StorageError",
    "StorageFullError",
    "SubscriptionError",
    "SyncRefusedError",
    "TooManyConnectionsError",
    "UnavailableError",
    "UnknownCodeError",
    "UnknownOpError",
    "UnsupportedError",
    "error_for_code",
]


class KapokError(Exception):
    """Root of every error Kapok raises on purpose."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class ConfigError(KapokError):
    code = "config"
    http_status = 500


class ProtocolError(KapokError):
    code = "protocol"
    http_status = 400


class BadRequestError(ProtocolError):
    code = "bad_request"
    http_status = 400


class UnknownOpError(BadRequestError):
    code = "unknown_op"
    http_status = 400


class MessageTooLargeError(BadRequestError):
    code = "message_too_large"
    http_status = 413


class AuthError(KapokError):
    code = "unauthorized"
    http_status = 401


class CsrfError(AuthError):
    code = "csrf_failed"
    http_status = 403


class AuthBlockedError(AuthError):
    """An address that sent too many wrong keys must wait ``retry_after_s`` before trying again."""

    code = "auth_blocked"
    http_status = 429

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooManyConnectionsError(KapokError):
    code = "too_many_connections"
    http_status = 503


class BrokerError(KapokError):
    code = "broker"
    http_status = 409


class QueueFullError(BrokerError):
    code = "queue_full"
    http_status = 507


class RateLimitedError(BrokerError):
    code = "rate_limited"
    http_status = 429


class UnknownCodeError(BrokerError):
    """Raised for codes that the caller does not hold; ``codes`` lists them."""

    code = "unknown_code"
    http_status = 404

    def __init__(self, message: str, codes: list[str] | None = None) -> None:
        super().__init__(message)
        self.codes = codes or []


class NotFoundError(BrokerError):
    """No such message, topic or group (settling never creates one)."""

    code = "not_found"
    http_status = 404


class SubscriptionError(BrokerError):
    code = "bad_subscription"
    http_status = 400


class UnavailableError(KapokError):
    code = "unavailable"
    http_status = 503


class NotActiveError(UnavailableError):
    """A passive slave refuses producers and consumers; the message names its master."""

    code = "not_active"


class FencedError(UnavailableError):
    code = "fenced"


class ReplicationUnavailableError(UnavailableError):
    """Sync mode: the paired slave has not confirmed in time (never a silent downgrade)."""

    code = "replication_unavailable"


class ReplicationUnconfirmedError(ReplicationUnavailableError):
    """Sync mode: the master stored the batch, but its slave did not confirm it within
    ``sync_timeout_ms``. The batch is in doubt: sending it again (with its dedup ids) to the
    same pair is safe, sending it elsewhere may store it twice."""

    code = "replication_unconfirmed"


class ReplicationError(KapokError):
    code = "replication"
    http_status = 409


class SyncRefusedError(ReplicationError):
    """``why``: ``paired`` (the master has another slave), ``newer_epoch`` (the slave led
    later than the master did), ``behind`` (the slave fell out of the backlog)."""

    code = "sync_refused"

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why


class StorageError(KapokError):
    """What is on disk cannot be written or read: the write-ahead log or the archive failed
    a write, a snapshot, log record, pair state or KapokMQ data file cannot be decoded, or
    ``storage.dir`` is locked by another process. A request that fails with it gets a 500."""

    code = "storage"
    http_status = 500


class StorageFullError(StorageError, UnavailableError):
    """``storage.dir`` has less free space than ``storage.min_free_bytes``, or a write found
    none: new messages are refused before anything is applied (a producer may send them to
    another node), while consumers, acks and reads go on. Ends by itself once space is freed."""

    code = "storage_full"
    http_status = 507


class ClientError(KapokError):
    code = "client"
    http_status = 500


class ConnectionLostError(ClientError):
    """``in_doubt``: the connection broke after a request was written, so the node may
    have acted on it; otherwise nothing was sent (the connection could not be opened)."""

    code = "connection_lost"

    def __init__(self, message: str, in_doubt: bool = True) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt


class SlowConsumerError(ClientError):
    code = "slow_consumer"


class ClientClosedError(ClientError):
    code = "closed"


class UnsupportedError(ClientError):
    code = "unsupported"
    http_status = 400


class ClusterUnavailableError(ClientError, UnavailableError):
    code = "cluster_unavailable"
    http_status = 503


class PublishTimeoutError(ClientError, UnavailableError):
    code = "publish_timeout"
    http_status = 503


class AnalyticsError(KapokError):
    code = "analytics"
    http_status = 500


def _all_subclasses(cls: type[KapokError]) -> list[type[KapokError]]:
    out: list[type[KapokError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


_ERROR_CLASSES: list[type[KapokError]] = [KapokError, *_all_subclasses(KapokError)]
_BY_CODE: dict[str, type[KapokError]] = {cls.code: cls for cls in _ERROR_CLASSES}


def error_for_code(code: str, message: str) -> KapokError:
    """Rebuild the error class a server named by ``code`` (used by the client)."""
    return _BY_CODE.get(code, KapokError)(message)
