"""The input ledger's rules (kapok.analytics.ledger): new files, their days, full runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kapok.analytics import ledger as lg
from kapok.analytics.ledger import FileSpan, FileStamp, Ledger

D1 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
DAY = 86400.0
SETTINGS = {"window": "hour", "inputs": ["/data"]}


def _ledger(**files: FileSpan) -> Ledger:
    return Ledger(SETTINGS, files)


def _span(size: int, first: float | None, last: float | None, mtime: float = 1.0) -> FileSpan:
    return FileSpan(FileStamp(size, mtime), first, last)


A = _span(100, D1 + 10, D1 + 3600)  # day one
B = _span(200, D1 + DAY - 60, D1 + DAY + 60)  # across midnight: days one and two
C = _span(300, D1 + 2 * DAY + 5, D1 + 2 * DAY + 50)  # day three


def test_only_new_and_grown_files_are_new() -> None:
    before = _ledger(a=A, b=B)
    current = {"a": A.stamp, "b": FileStamp(250, 2.0), "c": C.stamp}
    plan = lg.plan(before, current, SETTINGS)
    assert plan == lg.Plan(False, "", ("b", "c"))
    touched = FileStamp(100, 5.0)  # the same size, another mtime: written again
    assert lg.plan(before, {"a": touched}, SETTINGS).new == ("a",)
    assert lg.plan(before, {"a": A.stamp, "b": B.stamp}, SETTINGS).new == ()


@pytest.mark.parametrize(
    ("ledger", "settings", "full", "unreadable", "reason"),
    [
        (None, SETTINGS, False, "", "first run"),
        (
            None,
            SETTINGS,
            False,
            "not a ledger: KeyError",
            "the input ledger does not read (not a ledger: KeyError)",
        ),
        (_ledger(a=A), {**SETTINGS, "window": "day"}, False, "", "--window changed since the last run"),
        (_ledger(a=A), {**SETTINGS, "inputs": ["/data", "/n2"]}, False, "", "the set of --input changed"),
        (_ledger(a=A), SETTINGS, True, "", "--full"),
    ],
)
def test_what_makes_a_run_full(
    ledger: Ledger | None, settings: dict[str, object], full: bool, unreadable: str, reason: str
) -> None:
    plan = lg.plan(ledger, {"a": A.stamp, "c": C.stamp}, settings, full=full, unreadable=unreadable)
    assert plan.full and plan.new == ("a", "c")
    assert plan.reason.startswith(reason)


def test_the_days_of_new_files() -> None:
    before = _ledger(a=A, b=_span(150, D1 + DAY - 60, D1 + DAY - 1))  # b: day one, then it grew
    scanned = {"b": B, "c": C}
    days = lg.touched_days(before, scanned)
    assert days == {"2026-03-01", "2026-03-02", "2026-03-03"}
    assert lg.touched_days(before, {"c": C}) == {"2026-03-03"}
    assert lg.touched_days(None, {"e": _span(0, None, None)}) == set()  # no events: no day


def test_gone_files_leave_the_ledger_and_scanned_ones_replace_their_entry() -> None:
    before = _ledger(a=A, b=_span(150, D1, D1 + 1))
    after = lg.merge(before, {"b": B.stamp, "c": C.stamp}, {"b": B, "c": C}, SETTINGS)
    assert after == Ledger(SETTINGS, {"b": B, "c": C})
    kept = lg.merge(after, {"b": B.stamp, "c": C.stamp}, {}, SETTINGS)
    assert kept == after


def test_the_ledger_reads_back_and_a_corrupt_one_is_an_error() -> None:
    ledger = _ledger(a=A, e=_span(0, None, None))
    assert lg.decode(lg.encode(ledger)) == ledger
    for text in ("", "{", "[]", '{"version": 99}', '{"version": 1, "settings": {}}', lg.encode(ledger)[:40]):
        with pytest.raises(lg.LedgerError):
            lg.decode(text)
    broken = lg.encode(ledger).replace('"first_t": null', '"first_t": 3')
    with pytest.raises(lg.LedgerError, match="broken times"):
        lg.decode(broken)


def test_a_run_resumes_at_the_carried_midnight_when_nothing_new_is_older() -> None:
    carried = lg.Carried(D1 + DAY, "run-1", {"t": {"g": D1 + 5}}, 3)
    assert lg.resumed_days(carried, {"2026-03-03"}) == ["2026-03-02", "2026-03-03"]  # from its day on
    assert lg.resumed_days(carried, {"2026-03-02"}) == ["2026-03-02"]
    assert lg.resumed_days(carried, {"2026-03-01", "2026-03-02"}) is None  # older: every file is read
    assert lg.resumed_days(None, {"2026-03-02"}) is None
    assert lg.resumed_days(carried, set()) is None
    # and up to the input's last day: a change moves the backlog of every later day
    assert lg.resumed_days(carried, {"2026-03-02"}, D1 + 3 * DAY + 1) == [
        "2026-03-02",
        "2026-03-03",
        "2026-03-04",
    ]


def test_what_was_carried_reads_back_and_a_broken_entry_is_none() -> None:
    carried = lg.Carried(D1 + DAY, "run-1", {"t": {"g": D1 + 5.5, "h": D1 + 7}}, 12)
    ledger = Ledger(SETTINGS, {"a": A}, carried)
    assert lg.decode(lg.encode(ledger)) == ledger
    text = lg.encode(ledger)
    for name in ('""', '"../x"', "3"):  # the ledger still reads; the next run reads every file
        assert lg.decode(text.replace('"name": "run-1"', f'"name": {name}')).carried is None
    assert lg.decode(lg.encode(Ledger(SETTINGS, {"a": A}))).carried is None  # a ledger from before
    # A table from before runs carried every recent event (no "recent"): not enough to start from.
    assert lg.decode(text.replace('"recent": 12', '"recent": null')).carried is None
