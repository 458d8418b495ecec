"""Acceptance 2: a real node's topic as a Spark stream, exactly once across restarts.

One ``kapok serve`` process for the module; each test has its own topic. Spark's
Python workers reach the node over HTTP on 127.0.0.1, as they would on a cluster.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from kapok.launch import NodeProcess, start_node
from kapok.testing.slow import scaled

QUERY_S = round(scaled(120))  # how long one availableNow query may take to run to its end (whole s)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    workdir = tmp_path_factory.mktemp("stream-node")
    process = start_node(workdir, f"storage.dir={workdir / 'data'}", "storage.fsync=never")
    yield process
    process.stop()


def _call(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("Authorization", "Bearer test")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=scaled(10)) as response:
        return json.loads(response.read())


def _publish(node: NodeProcess, topic: str, first: int, count: int) -> dict[str, str]:
    """Publish messages ``m<first>`` …; returns code → payload."""
    payloads = [f"m{i}" for i in range(first, first + count)]
    codes = _call(
        node.url, "POST", f"/v1/topics/{topic}/messages", {"messages": [{"data": p} for p in payloads]}
    )
    return dict(zip(codes["codes"], payloads, strict=True))


def _group(node: NodeProcess, topic: str, name: str = "default") -> dict[str, Any]:
    stats = _call(node.url, "GET", f"/v1/topics/{topic}")
    [group] = [g for g in stats["groups"] if g["name"] == name]
    return dict(group)


def _status(node: NodeProcess, code: str) -> str:
    return str(_call(node.url, "GET", f"/v1/messages/{code}")["groups"]["default"]["status"])


def _stream(spark: SparkSession, node: NodeProcess, topic: str, per_batch: int, group: str = "") -> DataFrame:
    return (
        spark.readStream.format("kapok")
        .option("seeds", node.url)
        .option("topic", topic)
        .option("group", group)
        .option("maxMessagesPerBatch", str(per_batch))
        .load()
    )


def _read_codes(spark: SparkSession, path: Path) -> list[str]:
    return [r["code"] for r in spark.read.parquet(str(path)).select("code").collect()]


def test_available_now_into_memory_reads_every_message_once_and_acks_it(
    spark: SparkSession, node: NodeProcess
) -> None:
    sent = _publish(node, "s-memory", 0, 500)
    query = (
        _stream(spark, node, "s-memory", 200)
        .writeStream.format("memory")
        .queryName("s_memory")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(QUERY_S)
    assert not query.isActive and query.exception() is None
    rows = spark.sql("SELECT code, topic, CAST(data AS STRING) AS text, attempts FROM s_memory").collect()
    assert Counter(r["code"] for r in rows) == Counter(dict.fromkeys(sent, 1))
    assert {r["code"]: r["text"] for r in rows} == sent
    assert {(r["topic"], r["attempts"]) for r in rows} == {("s-memory", 1)}
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert batches == [200, 200, 100]  # maxMessagesPerBatch
    group = _group(node, "s-memory")
    assert (group["ready"], group["inflight"]) == (0, 0)
    assert {_status(node, code) for code in sent} == {"consumed"}


def test_file_sink_stopped_between_batches_restarts_from_its_checkpoint(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    def run() -> None:
        query = (
            _stream(spark, node, "s-files", 150)
            .select("code", "data")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_S)
        assert not query.isActive and query.exception() is None

    sent = _publish(node, "s-files", 0, 400)
    run()  # three batches, then the query stops
    assert Counter(_read_codes(spark, tmp_path / "out")) == Counter(dict.fromkeys(sent, 1))
    sent |= _publish(node, "s-files", 400, 250)
    run()  # restarted from the checkpoint: only what came since
    assert Counter(_read_codes(spark, tmp_path / "out")) == Counter(dict.fromkeys(sent, 1))
    group = _group(node, "s-files")
    assert (group["ready"], group["inflight"]) == (0, 0)


def test_a_query_that_dies_inside_a_batch_replays_it_exactly_from_the_checkpoint(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    """The query dies after batch 1's offsets were logged and part of its output written."""
    crash = {"batch": 1}

    def write(batch: DataFrame, batch_id: int) -> None:
        # Idempotent per batch (overwrite by id), as foreachBatch sinks must be.
        batch.select("code", "data").write.mode("overwrite").parquet(
            str(tmp_path / "out" / f"batch={batch_id}")
        )
        if crash.get("batch") == batch_id:
            del crash["batch"]  # once: the restarted query gets through
            raise RuntimeError("the process died here")

    def run() -> None:
        query = (
            _stream(spark, node, "s-crash", 250)
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_S)

    sent = _publish(node, "s-crash", 0, 600)
    with pytest.raises(StreamingQueryException, match="the process died here"):
        run()
    # The offset Spark logged is small: the source's id, the batch number, the pair's share.
    text = (tmp_path / "checkpoint" / "offsets" / "1").read_text().splitlines()[-1]
    logged = json.loads(text)
    assert set(logged) == {"id", "seq", "pairs"} and list(logged["pairs"].values()) == [250]
    assert len(text) < 200 and not (tmp_path / "checkpoint" / "commits" / "1").exists()
    batch_one = _read_codes(spark, tmp_path / "out" / "batch=1")  # written before the crash
    assert len(batch_one) == 250
    # Batch 0 was committed and acked; batch 1 is not acked: still in flight under its claim.
    assert {_status(node, code) for code in _read_codes(spark, tmp_path / "out" / "batch=0")} == {"consumed"}
    assert {_status(node, code) for code in batch_one} == {"inflight"}

    run()  # restarted: batch 1 again (the same claim: the same messages), then batch 2
    assert sorted(_read_codes(spark, tmp_path / "out" / "batch=1")) == sorted(batch_one)
    assert Counter(_read_codes(spark, tmp_path / "out")) == Counter(dict.fromkeys(sent, 1))
    group = _group(node, "s-crash")
    assert (group["ready"], group["inflight"]) == (0, 0)
    assert {_status(node, code) for code in sent} == {"consumed"}


def test_a_new_named_group_is_created_by_its_first_read_and_gets_what_comes_after(
    spark: SparkSession, node: NodeProcess
) -> None:
    before = _publish(node, "s-groups", 0, 30)  # for the topic's default group only

    def run(name: str) -> list[str]:
        query = (
            _stream(spark, node, "s-groups", 100, group="spark")
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_S)
        assert query.exception() is None
        return [r["code"] for r in spark.sql(f"SELECT code FROM {name}").collect()]

    assert run("s_groups_first") == []
    assert _group(node, "s-groups", "spark")["ready"] == 0
    after = _publish(node, "s-groups", 30, 20)
    assert sorted(run("s_groups_second")) == sorted(after)
    assert (_group(node, "s-groups", "spark")["inflight"], _group(node, "s-groups")["ready"]) == (0, 50)
    assert not set(before) & set(after)


def test_earliest_gives_a_new_group_what_the_topic_holds_latest_what_comes_after(
    spark: SparkSession, node: NodeProcess
) -> None:
    held = _publish(node, "s-start", 0, 40)

    def run(name: str, group: str, position: str) -> list[str]:
        query = (
            spark.readStream.format("kapok").option("seeds", node.url).option("topic", "s-start")
            .option("group", group).option("startingPosition", position).load()
            .writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
        )  # fmt: skip
        query.awaitTermination(QUERY_S)
        assert query.exception() is None
        return sorted(r["code"] for r in spark.sql(f"SELECT code FROM {name}").collect())

    assert run("s_start_early", "early", "earliest") == sorted(held)
    assert run("s_start_late", "late", "latest") == []
    after = _publish(node, "s-start", 40, 10)
    # Groups that exist read on from where they are, whatever the option says.
    assert run("s_start_early_again", "early", "earliest") == sorted(after)
    assert run("s_start_late_again", "late", "earliest") == sorted(after)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"maxMessagePerBatch": "5"},
            "unknown option maxmessageperbatch (did you mean maxMessagesPerBatch?)",
        ),
        ({"startingPosition": "first"}, "startingPosition is latest or earliest, got 'first'"),
    ],
)
def test_a_bad_option_fails_the_query_with_one_line(
    spark: SparkSession, node: NodeProcess, options: dict[str, str], says: str
) -> None:
    _publish(node, "s-options", 0, 5)
    reader = spark.readStream.format("kapok").option("seeds", node.url).option("topic", "s-options")
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=re.escape(says)):
        query = (
            reader.load()
            .writeStream.format("memory")
            .queryName("s_options")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_S)
        raise AssertionError(f"the query ended without an error: {query.exception()}")


def test_an_ack_the_node_could_not_take_is_delivered_at_the_next_trigger(tmp_path: Path) -> None:
    """The source's driver calls, no JVM: a batch read, its node restarted (the claim
    survives), the batch replayed by a new reader (the same messages), the commit while
    the node is down, and the ack delivered at the next ``latestOffset`` once it is back."""
    from kapok.analytics.stream import KapokPartition, KapokStreamReader
    from kapok.analytics.streamplan import StreamOptions

    def launch(*sets: str) -> NodeProcess:
        return start_node(tmp_path, f"storage.dir={tmp_path / 'data'}", "storage.fsync=never", *sets)

    node = launch()
    try:
        port = node.url.rsplit(":", 1)[1]
        sent = _publish(node, "s-acks", 0, 30)
        options = StreamOptions.parse({"seeds": node.url, "topic": "s-acks", "timeoutSeconds": "0.5"})

        def batch(reader: KapokStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
            parts = reader.partitions(start, end)
            assert [type(p) for p in parts] == [KapokPartition]  # one pair, one partition, no data in it
            return [row[0] for part in parts for row in reader.read(part)]

        reader = KapokStreamReader(options)
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        assert end["seq"] == 1 and list(end["pairs"].values()) == [30]
        codes = batch(reader, start, end)
        assert sorted(codes) == sorted(sent)
        node.stop()
        node = launch(f"server.port={port}")
        # The query restarted: a new reader replays the logged batch, and gets the same messages.
        assert sorted(batch(KapokStreamReader(options), start, end)) == sorted(codes)
        assert _group(node, "s-acks")["inflight"] == 30
        node.stop()
        reader.commit(end)  # the node is down: the ack waits
        node = launch(f"server.port={port}")
        assert _group(node, "s-acks")["inflight"] == 30
        assert reader.latestOffset(end, None) == end  # nothing new, and the ack delivered
        assert (_group(node, "s-acks")["inflight"], _group(node, "s-acks")["ready"]) == (0, 0)
        assert {_status(node, code) for code in sent} == {"consumed"}
    finally:
        node.stop()


class _FakePair(http.server.BaseHTTPRequestHandler):
    """A pair's nodes as one scripted server: its view (``server.rows``), an empty group,
    and the acks it gets (``server.acks``)."""

    def do_GET(self) -> None:
        server: Any = self.server
        if self.path == "/cluster/nodes":
            self._send(server.rows)
        else:
            self._send({"live": 0, "groups": [{"name": "default", "ready": 0}]})

    def do_POST(self) -> None:
        server: Any = self.server
        server.acks.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send({"settled": 0, "unknown": []})

    def _send(self, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


def test_after_a_takeover_the_recent_acks_are_sent_to_the_new_active_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ack the old master took just before its kill -9 may not have reached its slave
    (async replication): the driver sends the pair's recent acks again to the new one."""
    from kapok.analytics import stream
    from kapok.analytics.streamplan import StreamOptions

    monkeypatch.setattr(stream, "VIEW_MAX_AGE_S", 0.0)  # the view asked at every call
    monkeypatch.setattr(stream, "IDLE_POLL_S", 0.0)
    server: Any = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakePair)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    row = {"http_url": url, "state": "alive", "pair_id": "m1", "active": True}
    server.rows, server.acks = [{**row, "name": "m1", "role": "master", "epoch": 1}], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        reader = stream.KapokStreamReader(StreamOptions.parse({"seeds": url, "topic": "t"}))
        start = reader.initialOffset()
        assert reader.latestOffset(start, None) == start  # nothing ready
        end = {**start, "seq": 1, "pairs": {"m1": 10}}
        reader.commit(end)
        claim = f"{start['id']}.1.0"
        assert server.acks == [{"group": "default", "claim": claim}]
        assert reader.latestOffset(end, None) == end and len(server.acks) == 1  # same leader: no re-ack
        server.rows = [{**row, "name": "s1", "role": "master", "epoch": 2}]  # s1 took over
        assert reader.latestOffset(end, None) == end
        assert server.acks == [{"group": "default", "claim": claim}] * 2
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.timeout(300)
def test_a_query_stopped_mid_batch_prints_no_java_trace(
    spark: SparkSession, node: NodeProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from pyspark.sql import functions as F

    # The JVM writes to the stderr it got at start: pytest's capture of the whole run.
    capture: Any = request.config.pluginmanager.getplugin("capturemanager")
    if capture is None or not capture.is_globally_capturing():
        pytest.skip("needs pytest's capture of file descriptors (not -s)")
    _publish(node, "s-stop", 0, 20)

    @F.udf("string", useArrow=False)
    def slow(code: str) -> str:
        time.sleep(5)  # the batch's tasks are running when the query stops
        return code

    query = (
        _stream(spark, node, "s-stop", 20)
        .select(slow("code").alias("code"))
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    deadline = time.monotonic() + scaled(120)
    while not spark.sparkContext.statusTracker().getActiveStageIds():
        assert time.monotonic() < deadline and query.isActive
        time.sleep(0.2)
    time.sleep(1)
    capture.read_global_capture()
    query.stop()
    time.sleep(2)  # what the stop's threads log comes within this
    err = capture.read_global_capture().err
    assert "Exception" not in err and "\tat " not in err, err[:2000]
