"""Stateful property test of claims: random pulls (claimed or not), acks and nacks by claim
or by code, deletes, expiries, push consumers in the same group and a moving clock.

After every step: the claim index is exact (every claimed entry in flight, held by the
pull lessee, indexed both ways, no empty claim kept), a claim fetched again answers the
codes it was given and no others, and the journal so far, replayed into a fresh broker
(recovery, or a slave's takeover), keeps every claim with the same codes in the same
order. Each message is acked at most once.
"""

from __future__ import annotations

from dataclasses import replace

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kapok.config import Config, FrozenMap, TopicOverride
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.consumers import Consumer
from kapok.core.model import Status
from kapok.core.replay import Mirror, state_records

T0 = 1_700_000_000.0
CLAIMS = ("c0", "c1", "c2")
LEASES = (2.0, 5.0)
CONFIG = replace(
    Config.default().mq,
    max_deliveries=4,
    topics=FrozenMap({"t": TopicOverride(ack_timeout_s=3.0)}),
)


class ClaimMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker(CONFIG.settings(), journal=True)
        self.now = T0
        self.broker.pull_group("t", "g", self.now)
        self.journal: list[ch.Change] = list(state_records(self.broker, self.now))
        self.acked: set[str] = set()
        self.push: Consumer | None = None

    def _take(self) -> None:
        self.journal += self.broker.take_changes()
        pushes = self.broker.take_pushes()
        if self.push is not None:
            pushed = pushes.get(self.push.id, [])
            if pushed:  # the push consumer acks right away
                codes = [e.msg.code for e in pushed]
                assert not self.acked & set(codes)
                self.acked |= set(codes)
                self.broker.ack(self.push.id, codes, self.now)
                self._take()

    def _live_claims(self) -> dict[str, list[str]]:
        claims = self.broker.topics["t"].groups["g"].claims
        if claims is None:
            return {}
        return {name: [e.msg.code for e in c.entries] for name, c in claims.by_name.items()}

    @rule(n=st.integers(1, 6), ttl=st.sampled_from([0.0, 0.0, 4.0]))
    def publish(self, n: int, ttl: float) -> None:
        self.broker.publish([Draft("t", b"x", ttl_s=ttl) for _ in range(n)], self.now)
        self._take()

    @rule(n=st.integers(1, 5), claim=st.sampled_from(("", *CLAIMS)), lease=st.sampled_from(LEASES))
    def pull(self, n: int, claim: str, lease: float) -> None:
        before = self._live_claims().get(claim) if claim else None
        got = [e.msg.code for e in self.broker.pull("t", "g", n, lease, self.now, claim)]
        if before is not None:
            assert got == before  # fetched again: the same, nothing new
            assert not [r for r in self.broker.take_changes() if isinstance(r, ch.Delivered)]
        self._take()

    @rule(claim=st.sampled_from(CLAIMS), how=st.sampled_from(list(Settle)))
    def settle_claim(self, claim: str, how: Settle) -> None:
        held = self._live_claims().get(claim, [])
        settled, unknown = self.broker.settle_leases("t", "g", [], claim, how, self.now)
        assert (settled, unknown) == (len(held), [])
        if how is Settle.ACK:
            assert not self.acked & set(held)
            self.acked |= set(held)
        self._take()

    @rule(data=st.data(), how=st.sampled_from(list(Settle)))
    def settle_one_by_code(self, data: st.DataObject, how: Settle) -> None:
        lessee = self.broker.topics["t"].groups["g"].pull
        if lessee is None or not lessee.held:
            return
        code = data.draw(st.sampled_from(sorted(lessee.held)))
        assert self.broker.settle_in_group("t", "g", [code], how, self.now) == []
        if how is Settle.ACK:
            assert code not in self.acked
            self.acked.add(code)
        self._take()

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        live = sorted(code for code, m in self.broker.messages.items() if m.live and m.topic == "t")
        if live:
            self.broker.delete(data.draw(st.sampled_from(live)), self.now)
            self._take()

    @rule(dt=st.sampled_from([0.0, 1.0, 2.5, 6.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.broker.tick(self.now)
        self._take()

    @rule()
    def toggle_push_consumer(self) -> None:
        if self.push is None:
            self.push = self.broker.subscribe("t", group="g", now=self.now, prefetch=2)
        else:
            self.broker.unsubscribe(self.push.id, self.now)
            self.push = None
        self._take()

    @invariant()
    def index_is_exact(self) -> None:
        group = self.broker.topics["t"].groups["g"]
        claims = group.claims
        if claims is None:
            return
        assert claims.by_name
        total = 0
        for claim in claims.by_name.values():
            assert claim.entries
            for e in claim.entries:
                total += 1
                assert claims.of[e] is claim
                assert e.status is Status.INFLIGHT
                assert group.pull is not None and e.consumer is group.pull
                assert group.pull.held[e.msg.code] is e
        assert total == len(claims.of)

    @invariant()
    def recovery_keeps_every_claim(self) -> None:
        mirror = Mirror(Broker(CONFIG.settings(), journal=True))
        for record in self.journal:
            mirror.apply(record)
        mirror.promote(self.now + 100)
        recovered = mirror.broker
        group = recovered.topics["t"].groups.get("g")
        claims = group.claims if group is not None else None
        got = (
            {} if claims is None else {n: [e.msg.code for e in c.entries] for n, c in claims.by_name.items()}
        )
        assert got == self._live_claims()
        # And each is fetched again from the recovered broker, with its lease length.
        for name, codes in got.items():
            assert [e.msg.code for e in recovered.pull("t", "g", 1, 9.0, self.now + 101, name)] == codes


TestClaims = ClaimMachine.TestCase
TestClaims.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
