"""The archive's event kinds with a real node (docs/analytics.md, "Event schema").

One ``kapok serve`` process with ``mq.expired=dead_letter``: messages leased and not acked
when the node gets SIGKILL are delivered again after the restart, and the archive holds
one ``retried`` (reason ``recovery``, attempt 1) for each of them and for nothing else;
then, on the restarted node, an expiry is archived as ``expired`` and ``dead_lettered``,
the dead letter's requeue as ``requeued`` (not ``acked``), and a delete as one ``deleted``
with its topic (not ``dropped``). The node is stopped cleanly before the archive is read,
so its archiver has written everything.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kapok.launch import NodeProcess, start_node, wait_for
from kapok.storage.archive import list_archive_files, read_archive_file
from kapok.storage.events import Event
from kapok.testing.nodehttp import drain
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETS = ("storage.fsync=always", "mq.expired=dead_letter", "mq.max_deliveries=0")
HEADERS = {"Authorization": "Bearer test", "Content-Type": "application/json"}


def call(node: NodeProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.url + path, data=data, headers=HEADERS, method=method)
    with urllib.request.urlopen(request, timeout=scaled(10.0)) as resp:
        return json.loads(resp.read())


def publish(node: NodeProcess, topic: str, *messages: dict[str, Any]) -> list[str]:
    answer = call(node, "POST", f"/v1/topics/{topic}/messages", {"messages": list(messages)})
    codes = answer["codes"]
    assert isinstance(codes, list) and len(codes) == len(messages), answer
    return codes


def lease(node: NodeProcess, topic: str, n: int) -> list[str]:
    messages = call(node, "GET", f"/v1/topics/{topic}/messages?max={n}&lease_s=600")["messages"]
    return [m["code"] for m in messages]


def statuses(node: NodeProcess, code: str) -> dict[str, str]:
    return {group: e["status"] for group, e in call(node, "GET", f"/v1/messages/{code}")["groups"].items()}


def archived(workdir: Path) -> list[Event]:
    return [e for f in list_archive_files(workdir / "data" / "archive") for e in read_archive_file(f.path)]


def _content(event: Event) -> Event:
    """An event without what names it (its archiver's run, its record's LSN)."""
    return {k: v for k, v in event.items() if k not in ("run", "lsn")}


def test_the_archive_holds_each_lifecycle_step_as_its_documented_kind(tmp_path: Path) -> None:
    node = start_node(tmp_path, *SETS)
    try:
        jobs = publish(node, "jobs", *({"data": f"job {i}"} for i in range(5)))
        out = lease(node, "jobs", 3)
        assert out == jobs[:3]
        # A publish confirmed after the leases: their Delivered records are on disk too.
        publish(node, "sync", {"data": "after the leases"})
    finally:
        node.kill()

    node = start_node(tmp_path, *SETS)
    try:
        redelivered = [m for m in drain(node.url, topic="jobs") if m["attempts"] > 1]
        assert sorted(m["code"] for m in redelivered) == sorted(out)

        (ttl,) = publish(node, "ttl", {"data": "short-lived", "ttl_s": 0.2})
        wait_for(lambda: statuses(node, ttl) == {"default": "dead"}, scaled(10.0))
        (letter,) = lease(node, "ttl.dlq", 1)
        requeued = call(node, "POST", f"/v1/messages/{letter}/requeue")
        assert requeued["requeued"] == letter

        (gone,) = publish(node, "gone", {"data": "deleted before anyone took it"})
        assert call(node, "DELETE", f"/v1/messages/{gone}") == {"deleted": gone}
    finally:
        assert node.stop() == 0
    events = archived(tmp_path)

    retried = [e for e in events if e["ev"] == "retried"]
    assert sorted(e["code"] for e in retried) == sorted(out)  # one per redelivered message
    assert {(e["reason"], e["attempt"], e["topic"], e["group"]) for e in retried} == {
        ("recovery", 1, "jobs", "default")
    }

    of = Counter((e["ev"], e["code"]) for e in events)
    assert of["expired", ttl] == 1 and of["dead_lettered", ttl] == 1
    (dead,) = [e for e in events if e["ev"] == "dead_lettered"]
    assert dead["reason"] == "expired" and dead["topic"] == "ttl"

    assert of["requeued", letter] == 1 and of["acked", letter] == 0
    (again,) = [e for e in events if e["ev"] == "published" and e["topic"] == "ttl" and e["code"] != ttl]
    assert again["code"] == requeued["code"]

    assert [_content(e) for e in events if e["code"] == gone and e["ev"] != "published"] == [
        {"ev": "deleted", "code": gone, "topic": "gone", "t": pytest.approx(time.time(), abs=scaled(120.0))}
    ]
    assert not [e for e in events if e["ev"] == "dropped"]
