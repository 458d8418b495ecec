"""Message codes: 32 hex digits that order by creation time, and the blocks that make them cheap.

A code is 48 bits of milliseconds, 32 bits of node id and 48 bits of the node's sequence
number (``make_code``). A queued message keeps its code's ``CodeBlock`` (shared by up to 256
codes) and the last byte of its number rather than the code itself (``kapok.core.model``),
and ``CodeMaker`` makes the blocks of a publish batch without formatting an int a message.
"""

from __future__ import annotations

from typing import final

__all__ = ["HEX2", "SEQ_MASK", "CodeBlock", "CodeMaker", "code_prefix", "code_seq", "make_code"]


def make_code(create_ms: int, node_id: int, seq: int) -> str:
    """32 lowercase hex digits, like KapokMQ's codes, but ordered by creation time.

    48 bits of milliseconds, 32 bits of node id, 48 bits of node sequence: unique
    across the cluster (node ids differ) and across restarts (the sequence is
    restored by recovery), and sortable by creation time as plain strings.
    """
    return f"{code_prefix(create_ms, node_id)}{seq & 0xFFFFFFFFFFFF:012x}"


def code_prefix(create_ms: int, node_id: int) -> str:
    """The first 20 digits of ``make_code``: shared by a whole publish batch."""
    return f"{create_ms & 0xFFFFFFFFFFFF:012x}{node_id & 0xFFFFFFFF:08x}"


def code_seq(code: str) -> int | None:
    """The sequence number inside a code made by ``make_code`` (None: not such a code)."""
    if len(code) != 32:
        return None
    try:
        return int(code[20:], 16)
    except ValueError:
        return None


SEQ_MASK = 0xFFFFFFFFFFFF  # a code carries 48 bits of its message's number
HEX2 = tuple(f"{i:02x}" for i in range(256))


@final  # ``type(x) is CodeBlock`` then tells it from a code (a ``str``)
class CodeBlock:
    """What up to 256 codes made by ``make_code`` share: their first 30 digits (time, node,
    and the sequence number but its last byte), and the number of the block's first code.

    A message whose code has this layout keeps its block (one object for the messages of
    a publish batch) and the last byte of its number, a small int Python shares, instead of
    its code and its number: 128 bytes a queued message. Its code is the block's digits and
    two more (``Message.code``).
    """

    __slots__ = ("base", "head")

    def __init__(self, head: str, base: int) -> None:
        self.head = head  # 30 digits
        self.base = base  # the sequence number of the block's code ending in "00"

    def code(self, low: int) -> str:
        """The code of the block's message ``base + low``."""
        return self.head + HEX2[low]


class CodeMaker:
    """The ``CodeBlock`` of ``make_code`` for consecutive sequence numbers, without
    formatting an int per message.

    Formatting an int costs about as much as the rest of storing a message.
    The codes of one publish batch share their first 30 digits (time, node,
    and the sequence number but its last byte), so those are formatted once
    per batch and per 256 messages (a ``CodeBlock``), and the last two digits
    come from a table.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[str, int, CodeBlock] = ("", -1, CodeBlock("", -1))

    def block(self, prefix: str, seq: int) -> CodeBlock:
        """The block of ``make_code`` of the ``prefix`` (``code_prefix``) and ``seq``: the one
        of the last call when it is the same."""
        last_prefix, last_high, block = self._last
        high = (seq & SEQ_MASK) >> 8
        if high != last_high or prefix is not last_prefix:
            block = CodeBlock(f"{prefix}{high:010x}", seq & ~0xFF)
            self._last = (prefix, high, block)
        return block

    def compact(self, code: str, seq: int) -> CodeBlock | str:
        """What a ``Message`` keeps of ``code``, the code of message ``seq``: a shared
        ``CodeBlock`` if ``code`` is ``make_code``'s for ``seq`` (the block of the last
        one when it is the same), else the whole code (imported from KapokMQ, say)."""
        _, high, block = self._last
        if seq >> 8 == high and code == block.head + HEX2[seq & 0xFF]:
            return block  # the common case: the code after the last one (a replayed batch)
        if len(code) != 32 or seq > SEQ_MASK:
            return code
        block = self.block(code[:20], seq)
        return block if block.code(seq & 0xFF) == code else code
