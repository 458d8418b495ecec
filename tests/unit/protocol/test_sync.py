"""The sync link's frames: what each end writes, the other reads; anything else is refused."""

from __future__ import annotations

import pytest

from kapok.errors import ReplicationError
from kapok.protocol.sync import (
    decode_control,
    decode_records,
    encode_control,
    encode_records,
    get_int,
    get_str,
)


def test_frames() -> None:
    first, count, payload = decode_records(encode_records(2**40, 3, b"payload"))
    assert (first, count, bytes(payload)) == (2**40, 3, b"payload")
    assert decode_control(encode_control("ack", lsn=5)) == {"op": "ack", "lsn": 5}
    for bad in (b"R", b"S" + b"\0" * 20, encode_records(1, 0, b"")):
        with pytest.raises(ReplicationError):
            decode_records(bad)
    for bad_control in (b"nope", b"[1]", b'{"op": "launch"}', b'{"op": "ack"' + b" " * 70000 + b"}"):
        with pytest.raises(ReplicationError):
            decode_control(bad_control)


@pytest.mark.parametrize("value", [-1, "5", 1.5, True, None, 2**64])
def test_an_lsn_field_is_a_non_negative_integer(value: object) -> None:
    with pytest.raises(ReplicationError, match=r"^ack: field 'lsn'"):
        get_int({"op": "ack", "lsn": value}, "lsn")


def test_string_fields() -> None:
    frame = {"op": "hello", "node": "m1", "token": 5}
    assert get_str(frame, "node") == "m1"
    assert get_str(frame, "missing", "") == ""
    with pytest.raises(ReplicationError, match=r"^hello: field 'token' must be a string"):
        get_str(frame, "token")
