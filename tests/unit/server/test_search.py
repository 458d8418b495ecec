"""Message search (shared by KapokMQ's GetMessageList and the web console)."""

from __future__ import annotations

from typing import Any

from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.model import Draft
from kapok.server.routes.search import MessageQuery, search_messages

T0 = 1_700_000_000.0


def broker_with_messages() -> tuple[Broker, list[str]]:
    broker = Broker(Config.default().mq.settings())
    codes = [broker.publish([Draft("a" if i % 2 else "b", f"m{i}".encode())], T0 + i)[0] for i in range(10)]
    broker.publish([Draft("c", b"later", delay_s=100)], T0 + 20)
    return broker, codes


def test_newest_first_in_pages_with_the_total() -> None:
    broker, codes = broker_with_messages()
    page1 = search_messages(broker.messages, MessageQuery(topic="a"), T0 + 30, page=1, size=3)
    page2 = search_messages(broker.messages, MessageQuery(topic="a"), T0 + 30, page=2, size=3)
    assert page1.total == page2.total == 5
    assert [m.code for m in page1.messages + page2.messages] == [codes[i] for i in (9, 7, 5, 3, 1)]
    assert search_messages(broker.messages, MessageQuery(), T0, page=9, size=3).messages == []


def test_filters_time_status_group_code() -> None:
    broker, codes = broker_with_messages()
    consumer = broker.subscribe("b", now=T0 + 30)
    inflight = {e.msg.code for e in broker.take_pushes()[consumer.id]}
    now = T0 + 31

    def found(**query: Any) -> set[str]:
        page = search_messages(broker.messages, MessageQuery(**query), now, 1, 100)
        return {m.code for m in page.messages}

    assert found(start=T0 + 2, end=T0 + 4) == set(codes[2:5])
    assert found(status="inflight") == inflight == {codes[i] for i in (0, 2, 4, 6, 8)}
    assert found(status="ready") == {codes[i] for i in (1, 3, 5, 7, 9)}
    assert len(found(status="delayed")) == 1 and found(status="delayed") == found(topic="c")
    assert found(group="default", topic="c") == found(topic="c")
    assert found(group="nope") == set()
    assert found(wire_status=0) == found(topic="c")
    assert found(code=codes[3]) == {codes[3]}  # a whole code: looked up
    assert found(code=codes[3][:20]) >= {codes[3]}  # a prefix: matched
    assert found(code="f" * 32) == set()
