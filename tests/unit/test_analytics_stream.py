"""The stream source's pure parts (no Spark): options, offsets and claims, a batch's split,
the pairs of a cluster view; and ``on_pair``'s retries against real sockets."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kapok.analytics.masters import ClusterView, Pair, pairs_from_nodes
from kapok.analytics.pull import NodeClient, on_pair
from kapok.analytics.streamplan import Offset, StreamOptions, claims, split_limit
from kapok.errors import AnalyticsError

# -- options -------------------------------------------------------------------------------


def test_options_as_spark_users_know_them() -> None:
    opts = StreamOptions.parse(
        {
            "seeds": "http://a:1/, https://b:2",
            "topic": "t",
            "group": "g",
            "startingPosition": "Earliest",
            "maxMessagesPerBatch": "50",
            "leaseSeconds": "30",
            "timeoutSeconds": "2.5",
            "key": "k",
        }
    )
    assert opts == StreamOptions(("http://a:1", "https://b:2"), "t", "g", "earliest", "k", 50, 30.0, 2.5)
    assert opts.bound_s == 10.0


def test_url_is_one_seed_and_defaults_apply() -> None:
    # Spark hands the options over lower-cased (a case-insensitive map).
    opts = StreamOptions.parse({"url": "http://n:8011", "topic": "t", "maxmessagesperbatch": "7"})
    assert (opts.seeds, opts.group, opts.start, opts.max_per_batch, opts.lease_s) == (
        ("http://n:8011",), "default", "latest", 7, 600.0,
    )  # fmt: skip
    both = StreamOptions.parse({"url": "http://n:1", "seeds": "http://m:2,http://n:1", "topic": "t"})
    assert both.seeds == ("http://m:2", "http://n:1")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"topic": "t"}, "needs the option seeds"),
        ({"seeds": "http://a:1"}, "needs the option topic"),
        ({"seeds": "a:1", "topic": "t"}, "a seed is a node's http"),
        ({"seeds": "http://a:1", "topic": "t", "maxMessagesPerBatch": "0"}, "must be positive"),
        ({"seeds": "http://a:1", "topic": "t", "leaseSeconds": "nan"}, "must be positive"),
        ({"seeds": "http://a:1", "topic": "t", "timeoutSeconds": "x"}, "must be a number"),
        ({"seeds": "http://a:1", "topic": "t", "startingPosition": "first"}, "latest or earliest"),
        (
            {"seeds": "http://a:1", "topic": "t", "maxMessagePerBatch": "5"},
            "did you mean maxMessagesPerBatch",
        ),
    ],
)
def test_bad_options_are_one_clear_line(options: dict[str, str], says: str) -> None:
    with pytest.raises(AnalyticsError, match=says) as caught:
        StreamOptions.parse(options)
    assert "\n" not in caught.value.message


# -- offsets and claims ----------------------------------------------------------------------


def test_an_offset_is_small_and_names_its_claims() -> None:
    first = Offset.initial()
    assert first.to_json() == {"id": first.id, "seq": 0, "pairs": {}}
    batch = first.next({"m2": 2500, "m1": 10, "m3": 0})
    assert batch.to_json() == {"id": first.id, "seq": 1, "pairs": {"m1": 10, "m2": 2500}}
    assert Offset.from_json(json.loads(json.dumps(batch.to_json()))) == batch
    # Up to 1000 per pull: one claim per pull, derived from the offset alone.
    assert claims(batch, 2500) == [
        (f"{first.id}.1.0", 1000),
        (f"{first.id}.1.1", 1000),
        (f"{first.id}.1.2", 500),
    ]
    assert claims(batch, 10) == [(f"{first.id}.1.0", 10)]
    # The same offset (a replay after a restart) gives the same claims.
    assert claims(Offset.from_json(batch.to_json()), 2500) == claims(batch, 2500)
    # Bounded: however many messages, the offset stays a few dozen bytes per pair.
    big = first.next({"m1": 10**6, "m2": 10**6})
    assert len(json.dumps(big.to_json())) < 100


def test_a_bad_or_old_offset_is_refused_without_quoting_it() -> None:
    codes = ",".join(f"code{i}" for i in range(10_000))
    with pytest.raises(AnalyticsError, match="older kapok source") as old:
        Offset.from_json({"seq": 3, "codes": codes})
    assert "code1" not in old.value.message
    for bad in (
        {"id": "", "seq": 1, "pairs": {}},
        {"id": "x", "seq": "1", "pairs": {}},
        {"id": "x", "seq": 1},
    ):
        with pytest.raises(AnalyticsError, match="not one of this source"):
            Offset.from_json(bad)


@pytest.mark.parametrize(
    ("limit", "ready", "shares"),
    [
        (200, {"a": 500}, {"a": 200}),
        (200, {"a": 150, "b": 150}, {"a": 100, "b": 100}),
        (200, {"a": 30, "b": 500}, {"a": 30, "b": 170}),
        (201, {"a": 500, "b": 500}, {"a": 101, "b": 100}),
        (1000, {"a": 3, "b": 0, "c": 4}, {"a": 3, "c": 4}),
        (1, {"a": 5, "b": 5}, {"a": 1}),
        (10, {}, {}),
    ],
)
def test_a_batch_is_shared_among_the_pairs(limit: int, ready: dict[str, int], shares: dict[str, int]) -> None:
    assert split_limit(limit, ready) == shares


# -- the cluster view ------------------------------------------------------------------------


def _row(
    name: str, port: int, role: str, *, active: bool, pair_id: str, state: str = "alive", epoch: int = 1
) -> Any:
    return {
        "name": name, "http_url": f"http://127.0.0.1:{port}", "state": state, "role": role,
        "active": active, "pair_id": pair_id, "epoch": epoch, "pair": "",
    }  # fmt: skip


def test_every_master_pair_with_its_nodes_active_first() -> None:
    rows = [
        _row("m1", 1, "master", active=True, pair_id="m1"),
        _row("s1", 2, "slave", active=False, pair_id="m1"),
        _row("m2", 3, "master", active=True, pair_id="m2"),
    ]
    assert pairs_from_nodes(rows) == {
        "m1": Pair("m1", ("http://127.0.0.1:1", "http://127.0.0.1:2"), "m1", 1),
        "m2": Pair("m2", ("http://127.0.0.1:3",), "m2", 1),
    }


def test_a_takeover_keeps_the_pair_and_puts_the_slave_first() -> None:
    during = [
        _row("m1", 1, "master", active=False, pair_id="m1", state="dead"),
        _row("s1", 2, "slave", active=False, pair_id="m1"),
    ]
    assert pairs_from_nodes(during) == {"m1": Pair("m1", ("http://127.0.0.1:2", "http://127.0.0.1:1"))}
    assert pairs_from_nodes(during)["m1"].active_url is None
    after = [
        _row("m1", 1, "master", active=False, pair_id="m1", state="dead"),
        _row("s1", 2, "master", active=True, pair_id="m1", epoch=2),
    ]
    assert pairs_from_nodes(after) == {
        "m1": Pair("m1", ("http://127.0.0.1:2", "http://127.0.0.1:1"), "s1", 2)
    }
    # The give-back: the master active again at a higher epoch, the slave passive.
    back = [
        _row("m1", 1, "master", active=True, pair_id="m1", epoch=3),
        _row("s1", 2, "slave", active=False, pair_id="m1", epoch=3),
    ]
    assert pairs_from_nodes(back)["m1"] == Pair("m1", ("http://127.0.0.1:1", "http://127.0.0.1:2"), "m1", 3)


def test_malformed_rows_are_skipped() -> None:
    rows = [None, {"name": "x"}, _row("m1", 1, "master", active=True, pair_id="m1"), {**_row("y", 2, "master",
            active=True, pair_id="y"), "http_url": "ftp://y"}]  # fmt: skip
    assert list(pairs_from_nodes(rows)) == ["m1"]


# -- against real sockets ----------------------------------------------------------------------


class _Script(http.server.BaseHTTPRequestHandler):
    """Answers from the server's ``answers`` list in turn (status, body), recording paths."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer()

    def _answer(self) -> None:
        server: Any = self.server
        server.paths.append(self.path)
        status, body = server.answers.pop(0) if server.answers else (200, {})
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[Any]:
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Script)
    server.answers, server.paths = [], []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_on_pair_moves_to_the_other_node_and_waits_out_a_takeover(scripted: Any) -> None:
    dead = _closed_port_url()
    busy = (503, {"error": "not_active", "message": "s1 is a passive slave"})
    scripted.answers = [busy, busy, (200, {"messages": [], "claim": "c.1.0"})]
    slept: list[float] = []
    got = on_pair(
        [dead, scripted.url],
        lambda node: node.pull("t", "g", 10, 60.0, "c.1.0"),
        key="test", timeout_s=5.0, bound_s=30.0, what="pair m1, batch 1",
        sleep=slept.append, rand=lambda: 0.5,
    )  # fmt: skip
    assert got == [] and len(slept) == 2  # two rounds of "not now", then served
    assert slept == [0.05, 0.1]  # backoff: full jitter at 0.5 of 0.1, 0.2
    assert scripted.paths[-1].startswith("/v1/topics/t/messages?") and "claim=c.1.0" in scripted.paths[-1]


def test_on_pair_gives_up_at_its_bound_with_one_line_naming_the_pair() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(AnalyticsError) as caught:
        on_pair(
            [_closed_port_url()], lambda node: node.cluster_nodes(), key="", timeout_s=1.0, bound_s=10.0,
            what="pair m1, batch 7", sleep=sleep, clock=lambda: now[0], rand=lambda: 0.99,
        )  # fmt: skip
    text = caught.value.message
    assert "pair m1, batch 7" in text and "within 10 s" in text and "\n" not in text
    assert now[0] == pytest.approx(10.0)


def _no_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds} s: no retry was expected")


def test_an_answer_retrying_cannot_change_fails_at_once(scripted: Any) -> None:
    scripted.answers = [(401, {"error": "unauthorized", "message": "wrong key"})]
    with pytest.raises(AnalyticsError, match=r"pair m1, batch 2: .*wrong key"):
        on_pair([scripted.url], lambda node: node.ack_claim("t", "g", "c.2.0"), key="bad", timeout_s=5.0,
                bound_s=30.0, what="pair m1, batch 2", sleep=_no_sleep)  # fmt: skip


def test_a_node_without_claims_is_named(scripted: Any) -> None:
    scripted.answers = [(200, {"messages": []})]
    with (
        NodeClient(scripted.url, "test", 5.0) as node,
        pytest.raises(AnalyticsError, match="does not support claims"),
    ):
        node.pull("t", "g", 10, 60.0, "c.1.0")


def test_the_view_is_asked_of_known_members_then_seeds(scripted: Any) -> None:
    port = int(scripted.url.rsplit(":", 1)[1])
    scripted.answers = [(200, [_row("m1", port, "master", active=True, pair_id="m1")])]
    view = ClusterView([_closed_port_url(), scripted.url], timeout_s=5.0)
    assert view.refresh() == {"m1": Pair("m1", (scripted.url,), "m1", 1)}
    with pytest.raises(AnalyticsError, match="no node answered with its cluster view"):
        ClusterView([_closed_port_url()], timeout_s=5.0).refresh()
