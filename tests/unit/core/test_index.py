"""The broker's index of messages by code (``kapok.core.index``) and the codes messages keep."""

from __future__ import annotations

import pytest
from tests.unit.core.test_broker import make, pub

from kapok.core import state as state_module
from kapok.core.codes import CodeBlock, CodeMaker, code_prefix, make_code
from kapok.core.index import MessageIndex
from kapok.core.model import Draft, Message, Status
from kapok.core.topics import Group, Topic

GROUP = Group(Topic("t", make().settings.topic("t")), "g", durable=True)
PREFIX = code_prefix(1_700_000_000_000, 3)
BLOCKS = CodeMaker()


def msg(seq: int, code: str | None = None) -> Message:
    """A message numbered ``seq``, with ``make_code``'s code, or the foreign ``code``."""
    kept = BLOCKS.block(PREFIX, seq) if code is None else code
    return Message(seq, kept, b"x", group=GROUP, status=Status.READY)


def test_codes_are_found_and_iterated_in_sequence_order_with_strays_merged_in() -> None:
    index = MessageIndex()
    mine = [msg(seq) for seq in range(10, 20)]
    foreign = [msg(3, "a-kapokmq-code"), msg(21, "f" * 32), msg(25, "another")]
    for m in [*mine[5:], *foreign, *reversed(mine[:5])]:  # out of order, and foreign ones among them
        index.add(m)
    assert len(index) == 13
    everyone = sorted([*mine, *foreign], key=lambda m: m.seq)
    assert [m.seq for m in index.values()] == [m.seq for m in everyone]
    assert [m.seq for m in index.newest_first()] == [m.seq for m in reversed(everyone)]
    assert [index.get(m.code) for m in everyone] == everyone
    assert list(index) == [m.code for m in everyone] and dict(index.items()) == {m.code: m for m in everyone}
    assert index.pop(mine[0].code) is mine[0] and index.pop(foreign[0].code) is foreign[0]
    assert mine[0].code not in index and foreign[0].code not in index and len(index) == 11
    assert not index.discard(mine[0]) and index.discard(mine[1]) and not index.discard(mine[1])


def test_a_code_is_found_only_when_it_is_exactly_the_messages() -> None:
    index = MessageIndex()
    m = msg(0xAB)
    index.add(m)
    code = make_code(1_700_000_000_000, 3, 0xAB)
    assert m.code == code and index.get(code) is m
    near = [
        code.upper(),
        code[:20] + "0x" + code[22:],
        code[:20] + "0_" + code[22:],
        code[:-1] + "c",
        code[1:],
    ]
    near.append(make_code(1_700_000_000_001, 3, 0xAB))  # the same number, another head
    assert [index.get(c) for c in near] == [None] * len(near)
    assert index.get("") is None and index.get("x" * 32) is None


def test_holes_behind_an_old_message_are_cut_off_and_it_becomes_a_stray() -> None:
    """One message left open while a great many pass holds the list at its length, not at
    a slot per number published since."""
    index = MessageIndex()
    old = msg(1)
    index.add(old)
    for seq in range(2, 400_000):
        m = msg(seq)
        index.add(m)
        index.discard(m)
    assert len(index._rows) < 100_000
    assert index.get(old.code) is old and list(index.values()) == [old]
    newer = msg(400_000)
    index.add(newer)
    assert list(index.values()) == [old, newer] and index.get(newer.code) is newer
    assert index.discard(old) and list(index.values()) == [newer]


def test_numbers_far_ahead_start_the_list_again() -> None:
    index = MessageIndex()
    first = [msg(seq) for seq in range(5)]
    for m in first:
        index.add(m)
    later = [msg(10**9 + seq) for seq in range(5)]
    for m in later:
        index.add(m)
    assert len(index._rows) == 5  # the first five are strays, not the start of a billion slots
    assert list(index.values()) == first + later
    assert all(index.get(m.code) is m for m in first + later)


def test_a_message_that_waits_keeps_the_block_of_its_code_and_is_found_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind ``KEEP_CODES_QUEUED`` ready messages a published message keeps its code's
    block, shared with up to 255 others of its batch, and the last byte of its number, not
    its code and its number; delivered, it keeps its code and its number again."""
    monkeypatch.setattr(state_module, "KEEP_CODES_QUEUED", 5)
    b = make()
    first = [pub(b, "t") for _ in range(3)]
    assert all(type(b.messages[c]._code) is str for c in first)  # soon delivered: kept whole
    batch = b.publish([Draft("t", str(i).encode()) for i in range(300)], 2_000.0)
    kept = [b.messages[c]._code for c in batch]
    assert [type(k) for k in kept[:2]] == [str, str] and all(type(k) is CodeBlock for k in kept[2:])
    waiting = [b.messages[c] for c in batch[2:]]
    assert len({id(k) for k in kept[2:]}) == 2  # numbers 6 to 303: two blocks of 256
    assert all(0 <= m._seq < 256 for m in waiting)  # a byte: no int of its own
    assert [b.messages[c].code for c in batch] == batch
    assert [m.seq for m in waiting] == list(range(6, 304))
    consumer = b.subscribe("t", now=2_001.0)
    pushed = [e.msg for e in b.take_pushes()[consumer.id]]
    assert [m.code for m in pushed] == [*first, *batch][: len(pushed)]
    assert all(type(m._code) is str for m in pushed)
    assert [m.seq for m in pushed] == list(range(1, len(pushed) + 1))
    assert b.ack(consumer.id, [m.code for m in pushed], 2_002.0) == []
    assert all(b.messages[m.code] is m and not m.live for m in pushed)  # consumed, retained


def test_replayed_codes_share_their_blocks_and_foreign_codes_are_kept_whole() -> None:
    codes = CodeMaker()
    made = [make_code(42, 7, seq) for seq in range(300)]
    kept = [codes.compact(code, seq) for seq, code in enumerate(made)]
    assert all(type(k) is CodeBlock for k in kept)
    assert all(k is kept[0] for k in kept[:256]) and all(k is kept[256] for k in kept[256:])
    assert [k.code(seq & 0xFF) for seq, k in enumerate(kept)] == made  # type: ignore[union-attr]
    assert codes.compact(made[5], 6) == made[5]  # not that number's code
    upper = make_code(42, 10, 5).upper()  # hex digits in upper case: made again exactly all the same
    block = codes.compact(upper, 5)
    assert type(block) is CodeBlock and block.code(5) == upper
    assert codes.compact("a-kapokmq-code", 5) == "a-kapokmq-code"
    big = 2**48 + 5  # beyond what a code carries
    assert codes.compact(make_code(42, 7, big), big) == make_code(42, 7, big)
