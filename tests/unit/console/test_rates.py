"""Rates from counter samples: the pure arithmetic, and the sampler on a real service."""

from __future__ import annotations

from kapok.config import Config
from kapok.console.rates import DETAIL, TOTALS, RateSampler, Sample, history_chart, rate, total_rates
from kapok.core.model import Draft
from kapok.service import BrokerService
from kapok.testing.clock import ManualClock


def sample(t: float, published: int, delivered: int = 0, acked: int = 0) -> Sample:
    return Sample(t, (published, delivered, acked, 0, 0))


def test_rate_is_per_second_and_never_negative() -> None:
    assert rate(10, 30, 4.0) == 5.0
    assert rate(30, 10, 4.0) == 0.0  # a counter that restarted
    assert rate(1, 2, 0.0) == 0.0


def test_total_rates_and_the_chart_series() -> None:
    samples = [sample(100, 0), sample(102, 10, 4, 2), sample(104, 30, 10, 10)]
    assert total_rates(samples[0], samples[-1])["published"] == 7.5
    chart = history_chart(samples)
    assert chart["x"] == [102, 104] and chart["unit"] == "messages/s"
    series = {s["name"]: s["values"] for s in chart["series"]}
    assert series == {"publish": [5.0, 10.0], "deliver": [2.0, 3.0], "ack": [1.0, 4.0]}
    assert history_chart(samples[:1])["x"] == []
    assert TOTALS[:3] == ("published", "delivered", "acked")


async def test_sampler_reads_the_service_counters() -> None:
    clock = ManualClock()
    service = BrokerService(Config.default(), clock=clock)
    await service.start()
    sampler = RateSampler(service)
    sampler.sample()
    assert sampler.rates()["published"] == 0.0 and sampler.topic_rate("a") == 0.0
    service.publish([Draft("a", b"x")] * 4)
    service.publish([Draft("b", b"y")])
    clock.advance(2)
    sampler.sample()
    assert sampler.rates()["published"] == 2.5
    assert sampler.topic_rate("a") == 2.0 and sampler.topic_rate("b") == 0.5
    for _ in range(DETAIL + 3):  # the detail ring stays bounded; the rate window slides
        clock.advance(2)
        sampler.sample()
    assert len(sampler.detail) == DETAIL and sampler.rates()["published"] == 0.0
    assert sampler.consumer_rates(12345) == (0.0, 0.0)
    await service.aclose()
