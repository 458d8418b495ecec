"""The fault tests' checker on histories made by hand, and the health log on made-up polls."""

from __future__ import annotations

import threading

import pytest

from kapok.testing.history import HealthLog, History, Overlap

A, B, C, D = (f"http://127.0.0.1:{port}" for port in (1001, 1002, 1003, 1004))


def up(epoch: int = 1) -> dict[str, object]:
    return {"active": True, "epoch": epoch, "node": "n", "role": "master"}


def down(epoch: int = 1) -> dict[str, object]:
    return {"active": False, "epoch": epoch, "node": "n", "role": "slave"}


# --- History ---------------------------------------------------------------------------


def test_a_clean_history_is_valid() -> None:
    history = History()
    history.published("ok", "m1", "m2", "m3")
    history.delivered("m3", "m1", "m2")
    report = history.check()
    assert report.valid
    assert (report.confirmed, report.delivered) == (3, 3)
    assert (report.lost, report.unexpected, report.resurrected) == ((), (), ())
    assert dict(report.duplicates) == {}


def test_a_confirmed_message_never_delivered_is_lost() -> None:
    history = History()
    history.published("ok", "m1", "m2", "m3")
    history.delivered("m2")
    report = history.check()
    assert not report.valid
    assert report.lost == ("m1", "m3")


def test_duplicates_are_counted_and_allowed() -> None:
    history = History()
    history.published("ok", "m1", "m2")
    history.delivered("m1", "m2", "m1")
    history.delivered("m1")
    report = history.check()
    assert report.valid  # at least once
    assert dict(report.duplicates) == {"m1": 3}
    assert report.extra_deliveries == 2


def test_a_delivery_of_something_never_published_is_unexpected() -> None:
    history = History()
    history.published("ok", "m1")
    history.delivered("m1", "ghost")
    report = history.check()
    assert not report.valid
    assert report.unexpected == ("ghost",)
    assert report.lost == ()


def test_info_may_go_either_way() -> None:
    history = History()
    history.published("info", "t1", "t2")
    history.delivered("t2")
    report = history.check()
    assert report.valid
    assert (report.indeterminate, report.recovered, report.lost) == (2, 1, ())


def test_a_failed_publish_that_is_delivered_is_resurrected() -> None:
    history = History()
    history.published("fail", "f1", "f2")
    history.delivered("f2")
    report = history.check()
    assert not report.valid
    assert report.resurrected == ("f2",)
    assert report.failed == 2 and report.unexpected == ()


def test_a_retry_counts_by_its_best_outcome() -> None:
    history = History()
    history.published("info", "r1")
    history.published("ok", "r1")  # the retry was confirmed
    history.published("fail", "r1")  # a later failed attempt changes nothing
    history.published("fail", "r2")
    history.published("info", "r2")
    report = history.check()
    assert (report.confirmed, report.indeterminate, report.failed) == (1, 1, 0)
    assert report.lost == ("r1",)


def test_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="outcome"):
        History().published("maybe", "m1")  # type: ignore[arg-type]


def test_the_report_names_what_went_wrong_briefly() -> None:
    history = History()
    history.published("ok", *(f"m{i:02}" for i in range(30)))
    text = str(history.check())
    assert "lost 30 ['m00'" in text and "and 20 more" in text and "m29" not in text


def test_threads_may_record_at_once() -> None:
    history = History()

    def client(n: int) -> None:
        for i in range(500):
            history.published("ok", f"{n}-{i}")
            history.delivered(f"{n}-{i}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = history.check()
    assert report.valid and report.confirmed == report.delivered == 2000


# --- HealthLog -------------------------------------------------------------------------


def test_one_active_node_at_every_poll_is_no_overlap_and_no_gap() -> None:
    log = HealthLog([[A, B]])
    for i in range(10):
        log.observe(i * 0.05, {A: up(), B: down()})
    report = log.report()
    assert report.polls == 10
    assert report.overlaps == () and report.overlap_count == 0
    assert report.longest_gap_s == (0.0,)
    assert dict(report.answered) == {A: 10, B: 10}


def test_two_active_nodes_of_a_pair_are_an_overlap() -> None:
    log = HealthLog([[A, B], [C, D]])
    log.observe(0.0, {A: up(1), B: down(1), C: up(), D: down()})
    log.observe(0.05, {A: up(1), B: up(2), C: up(), D: down()})
    log.observe(0.10, {A: down(2), B: up(2), C: up(), D: up()})
    report = log.report()
    assert report.overlaps == (
        Overlap(at_s=0.05, pair=0, active=(A, B), epochs=(1, 2)),
        Overlap(at_s=0.10, pair=1, active=(C, D), epochs=(1, 1)),
    )
    assert report.overlap_count == 2


def test_active_nodes_of_different_pairs_are_no_overlap() -> None:
    log = HealthLog([[A, B], [C, D]])
    log.observe(0.0, {A: up(), B: down(), C: up(), D: down()})
    assert log.report().overlaps == ()


def test_a_gap_runs_from_the_last_active_poll_to_the_next() -> None:
    log = HealthLog([[A, B]])
    log.observe(1.0, {A: up(), B: down()})
    log.observe(1.1, {A: None, B: down()})  # A stopped answering
    log.observe(1.2, {A: None, B: down()})
    log.observe(1.6, {A: None, B: up(2)})  # B took over
    log.observe(1.7, {A: None, B: up(2)})
    log.observe(2.0, {A: down(2), B: down(2)})
    log.observe(2.2, {A: up(3), B: down(3)})
    report = log.report()
    assert report.longest_gap_s == pytest.approx((0.6,))
    assert dict(report.answered) == {A: 3, B: 7}
    assert report.last[A] == up(3)


def test_a_gap_still_open_counts_up_to_the_last_poll() -> None:
    log = HealthLog([[A, B]], start_s=0.0)
    log.observe(0.0, {A: up(), B: down()})
    log.observe(0.5, {A: None, B: None})
    log.observe(2.5, {A: None, B: None})
    assert log.report().longest_gap_s == (2.5,)
    assert log.report().last == {A: None, B: None}


def test_a_pair_never_active_has_a_gap_from_the_start() -> None:
    log = HealthLog([[A, B], [C]], start_s=0.0)
    log.observe(0.3, {A: down(), B: down(), C: up()})
    log.observe(0.9, {A: down(), B: up(), C: up()})
    assert log.report().longest_gap_s == (0.9, 0.0)


def test_overlaps_kept_are_bounded_but_all_are_counted() -> None:
    log = HealthLog([[A, B]])
    for i in range(HealthLog.MAX_OVERLAPS + 5):
        log.observe(float(i), {A: up(), B: up()})
    report = log.report()
    assert len(report.overlaps) == HealthLog.MAX_OVERLAPS
    assert report.overlap_count == HealthLog.MAX_OVERLAPS + 5


def test_pairs_must_be_given() -> None:
    with pytest.raises(ValueError, match="pair"):
        HealthLog([])
    with pytest.raises(ValueError, match="pair"):
        HealthLog([[A, B], []])
