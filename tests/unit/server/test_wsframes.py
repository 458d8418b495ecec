"""``ClientFrames``: RFC 6455 client frames parsed in bulk, every rule a server must enforce."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kapok.server.ws import frames as wsframes
from kapok.server.ws.frames import BINARY, CLOSE, PING, PONG, TEXT, ClientFrames, close_payload, unmask_int
from kapok.testing.wsraw import client_frame as frame

LIMIT = 1 << 20


def parse(data: bytes, limit: int = LIMIT) -> tuple[list[wsframes.Message], wsframes.FrameError | None]:
    frames = ClientFrames(limit)
    out = frames.feed(data)
    return out, frames.error


def test_text_binary_and_control_frames_in_one_read() -> None:
    data = (
        frame(TEXT, "héllo".encode())
        + frame(BINARY, b"\x00\xff")
        + frame(PING, b"p")
        + frame(PONG, b"")
        + frame(CLOSE, close_payload(1000, "bye"))
    )
    out, error = parse(data)
    assert error is None
    assert out == [(TEXT, "héllo"), (BINARY, b"\x00\xff"), (PING, b"p"), (PONG, b""), (CLOSE, (1000, "bye"))]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_every_length_encoding(size: int) -> None:
    payload = os.urandom(size)
    out, error = parse(frame(BINARY, payload) + frame(TEXT, b"x" * size))
    assert error is None
    assert out == [(BINARY, payload), (TEXT, "x" * size)]


def test_fragmented_message_with_a_ping_between_and_utf8_cut_across_fragments() -> None:
    text = "añb€c".encode()  # the cuts below fall inside the two-byte ñ and the three-byte €
    data = (
        frame(TEXT, text[:2], fin=False)
        + frame(PING, b"between")
        + frame(0, text[2:5], fin=False)
        + frame(0, text[5:], fin=True)
        + frame(TEXT, b"next")
    )
    out, error = parse(data)
    assert error is None
    assert out == [(PING, b"between"), (TEXT, "añb€c"), (TEXT, "next")]


def test_any_cut_of_the_stream_gives_the_same_messages() -> None:
    data = b"".join(frame(TEXT, f"m{i}".encode() * i) for i in range(60)) + frame(BINARY, os.urandom(70_000))
    whole, _ = parse(data)
    for step in (1, 2, 3, 7, 100, 4096):
        frames = ClientFrames(LIMIT)
        got = []
        for i in range(0, len(data), step):
            got += frames.feed(data[i : i + step])
        assert got == whole, step
        assert frames.error is None


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(TEXT, b"plain", mask=None), 1002),  # §5.1: clients must mask
        (frame(TEXT, b"x", rsv=4), 1002),  # RSV1 without a negotiated extension
        (frame(TEXT, b"x", rsv=1), 1002),
        (frame(3, b"x"), 1002),  # reserved data opcode
        (frame(0xB, b"x"), 1002),  # reserved control opcode
        (frame(PING, b"x", fin=False), 1002),  # fragmented control frame
        (frame(PING, b"x" * 126), 1002),  # control payload over 125 bytes
        (frame(0, b"x"), 1002),  # continuation with nothing to continue
        (frame(TEXT, b"a", fin=False) + frame(TEXT, b"b"), 1002),  # new message inside one
        (frame(TEXT, b"\xff\xfe"), 1007),  # not UTF-8
        (frame(TEXT, b"\xe2\x82", fin=False) + frame(0, b"x"), 1007),  # cut character never completed
        (frame(CLOSE, b"\x03"), 1002),  # close payload of one byte
        (frame(CLOSE, close_payload(1005)), 1002),  # reserved: never sent
        (frame(CLOSE, close_payload(1006)), 1002),
        (frame(CLOSE, close_payload(999)), 1002),
        (frame(CLOSE, close_payload(2000)), 1002),
        (frame(CLOSE, b"\x03\xe8\xff"), 1007),  # reason not UTF-8
        (frame(BINARY, b"x" * 65), 1009),
        (frame(TEXT, b"x" * 65), 1009),  # the whole-text-frame fast path checks the limit too
        (frame(TEXT, b"x" * 40, fin=False) + frame(0, b"x" * 40), 1009),  # too big once joined
    ],
)
def test_violations_fail_with_their_close_code(data: bytes, code: int) -> None:
    frames = ClientFrames(64)
    out = frames.feed(frame(TEXT, b"before") + data + frame(TEXT, b"after"))
    assert out == [(TEXT, "before")]  # what came before is kept, nothing after is read
    assert frames.error is not None and frames.error.code == code
    assert frames.feed(frame(TEXT, b"later")) == []


def test_oversized_frame_fails_before_its_payload_arrives() -> None:
    frames = ClientFrames(1000)
    head = frame(BINARY, b"x" * 5000)[:14]  # header and mask only
    assert frames.feed(head) == []
    assert frames.error is not None and frames.error.code == 1009


def test_valid_close_codes() -> None:
    for code in (1000, 1001, 1003, 1007, 1011, 1014, 3000, 4999):
        out, error = parse(frame(CLOSE, close_payload(code, "r")))
        assert error is None and out == [(CLOSE, (code, "r"))]
    out, error = parse(frame(CLOSE, b""))
    assert error is None and out == [(CLOSE, (0, ""))]


@given(st.binary(max_size=300), st.binary(min_size=4, max_size=4))
@settings(max_examples=200)
def test_integer_unmask_matches_the_compiled_one(payload: bytes, mask: bytes) -> None:
    expected = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert unmask_int(mask, payload) == expected
    assert wsframes._unmask(mask, payload) == expected


def test_pure_python_unmask_parses_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    data = frame(TEXT, "ü".encode() * 100) + frame(BINARY, os.urandom(70_000))
    expected, _ = parse(data)
    monkeypatch.setattr(wsframes, "_unmask", unmask_int)
    assert parse(data) == (expected, None)


@given(
    st.lists(
        st.tuples(st.sampled_from([TEXT, BINARY, PING]), st.binary(max_size=200), st.booleans()),
        max_size=12,
    ),
    st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=8),
)
@settings(max_examples=200)
def test_random_streams_cut_anywhere(spec: list[tuple[int, bytes, bool]], cuts: list[int]) -> None:
    data = b""
    expected: list[wsframes.Message] = []
    for opcode, payload, split in spec:
        if opcode == PING:
            payload = payload[:125]
            data += frame(PING, payload)
            expected.append((PING, payload))
            continue
        if opcode == TEXT:
            payload = payload.decode("latin-1").encode()  # valid UTF-8
        if split and len(payload) > 1:
            data += frame(opcode, payload[:1], fin=False) + frame(0, payload[1:])
        else:
            data += frame(opcode, payload)
        expected.append((opcode, payload.decode() if opcode == TEXT else payload))
    frames = ClientFrames(LIMIT)
    got: list[wsframes.Message] = []
    pos, i = 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        got += frames.feed(data[pos : pos + step])
        pos += step
        i += 1
    assert frames.error is None
    assert got == expected
