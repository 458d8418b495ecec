"""A mirror (a slave's copy of its master's log) journals nothing of its own: its log must
hold the master's records under the master's LSNs and nothing else."""

from __future__ import annotations

from kapok.config import Config
from kapok.core.broker import Broker, Draft
from kapok.core.replay import Mirror

T0 = 1_700_000_000.0


def test_applying_a_masters_records_journals_nothing_on_the_mirror() -> None:
    settings = Config.default().mq.settings()
    master = Broker(settings, journal=True)
    master.subscribe("orders", now=T0)  # a new p2p topic: its durable group "default" is journaled
    master.publish([Draft("news", b"a")], T0 + 1)  # another new topic, by a publish
    records = master.take_changes()
    assert records  # the master did journal them

    mirror = Mirror(Broker(settings, journal=True))  # as on a slave: its store wants changes
    for record in records:
        mirror.apply(record)
    assert mirror.broker.take_changes() == []
    assert mirror.broker.journal  # and it journals again once it leads
    assert set(mirror.broker.topics) == {"orders", "news"}
