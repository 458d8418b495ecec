"""``MaskCheck`` walks client frame headers: masked streams pass, the first unmasked frame fails."""

from __future__ import annotations

import os
import struct

from hypothesis import given
from hypothesis import strategies as st

from kapok.server.ws.mask import MaskCheck


def frame(payload: bytes, *, masked: bool = True, opcode: int = 1) -> bytes:
    """A client frame as RFC 6455 §5.2 lays it out (the mask key is random, as clients make it)."""
    n = len(payload)
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((0x80 | opcode, mask_bit | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, mask_bit | 126)) + struct.pack("!H", n)
    else:
        head = bytes((0x80 | opcode, mask_bit | 127)) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def feed_in_pieces(check: MaskCheck, stream: bytes, cuts: list[int]) -> bool:
    ok = True
    start = 0
    for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
        ok = check.feed(stream[start:cut]) and ok
        start = cut
    return ok


sizes = st.sampled_from([0, 1, 125, 126, 127, 65535, 65536, 70000])


@given(st.lists(sizes, min_size=1, max_size=6), st.lists(st.integers(0, 10**6), max_size=8))
def test_masked_frames_pass_however_the_stream_is_cut(lengths: list[int], cuts: list[int]) -> None:
    stream = b"".join(frame(b"x" * n) for n in lengths)
    assert feed_in_pieces(MaskCheck(), stream, cuts)


@given(st.lists(sizes, max_size=4), sizes, st.lists(st.integers(0, 10**6), max_size=8))
def test_the_first_unmasked_frame_fails_and_stays_failed(
    before: list[int], bad: int, cuts: list[int]
) -> None:
    stream = b"".join(frame(b"y" * n) for n in before) + frame(b"z" * bad, masked=False) + frame(b"ok")
    check = MaskCheck()
    assert not feed_in_pieces(check, stream, cuts)
    assert not check.ok
    assert not check.feed(frame(b"later"))


def test_an_unmasked_close_frame_fails_too() -> None:
    assert not MaskCheck().feed(frame(b"\x03\xe8", masked=False, opcode=8))
