"""Where a node can be given other parts than the real ones: the seams of ``make_app``.

A normal ``kapok serve`` passes none and runs the real network and the real sync link.
The fault injector (``python -m kapok.faulty``, its faults in ``kapok.testing.faults``)
passes wrappers here instead of reassigning methods of the classes, so what it changes
is visible in one place and type-checked like the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kapok.cluster.transport import Transport
from kapok.replication.link import LinkFactory

__all__ = ["Seams"]


@dataclasses.dataclass(frozen=True)
class Seams:
    """Each field None: the real part."""

    gossip_transport: Callable[[], Transport] | None = None
    """Makes the gossip node's transport (``GossipNode(transport=...)``)."""
    sync_link: LinkFactory | None = None
    """Makes both ends' sync link (``ReplicationNode(link_factory=...)``)."""
    on_gossip_started: Callable[[], None] | None = None
    """Called on the event loop once the gossip node has started (clustered nodes only)."""
