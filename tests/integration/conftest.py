"""Fixtures of the integration layer: nodes served in the test's own event loop, and the
blocking-call detector every test of the layer runs under (``blocking_calls``)."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import blockbuster.blockbuster as blockbuster_module
import pytest
from blockbuster import BlockBuster, BlockingError

import kapok
import kapok.testing
from kapok.config import load_config
from kapok.testing.inprocess import RunningApp, run_app

Start = Callable[..., Awaitable[RunningApp]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    """``await start(name, *sets)``: a node named ``name`` with its storage under ``tmp_path``
    (fsync never) and the ``--set`` items ``sets``; every node started is stopped at the end."""
    running: list[RunningApp] = []

    async def start_node(name: str, *sets: str) -> RunningApp:
        config = load_config(
            None,
            overrides=[f"server.name={name}", f"storage.dir={tmp_path / name}", "storage.fsync=never", *sets],
            env={},
        )
        node = await run_app(config)
        running.append(node)
        return node

    yield start_node
    for node in reversed(running):
        await node.stop()


# ---------------------------------------------------------------------------------------
# The blocking-call detector
#
# Every test of this layer runs with blockbuster on: a blocking call (time.sleep, file or
# blocking-socket I/O, os.stat, a wait on a held lock, ...) made on the event loop's thread
# while the loop runs, from a stack that passes through kapok's code, fails the test. The
# call itself goes on: an error raised inside the node would be caught by its own handlers
# and turn into a 500 or a retried step, so the test would fail for another reason, or not
# at all. It is recorded with its stack instead, and the test fails at its end with the list.
#
# Not counted: a test's own plain call into a kapok function (list_segments on a folder it
# inspects, make_app while it starts a node): no coroutine of kapok's is on the way, so
# nothing of a node waits on it. And what blocks by design, by function (file, functions,
# why it is fine on the loop):
ALLOWED: Final[tuple[tuple[str, frozenset[str], str], ...]] = (
    ("logging/__init__.py", frozenset({"emit"}),
     "a log line is written where it happens, by design; lines are few and rate-limited"),
    ("logging/handlers.py", frozenset({"emit"}),
     "the same, for the rotating log file (log.file), its rotation included"),
    ("kapok/storage/segments.py", frozenset({"write"}),
     "the WAL's small batches (INLINE_WRITE_BYTES, 64 KiB, no fsync awaited) are written inline "
     "by design; larger ones go to its thread"),
    ("kapok/storage/disk.py", frozenset({"open"}),
     "start-up, before the node serves: makes and lists its storage folder"),
    ("kapok/replication/state.py", frozenset({"load"}),
     "start-up, before the node serves: reads its small pair-state file"),
    ("kapok/node/app.py", frozenset({"make_app"}),
     "start-up, before the node serves: finds the console's template and static folders"),
    ("kapok/bench/proc.py", frozenset({"_tree"}),
     "the benchmarks read their own RSS from /proc (memory, not disk) between timed phases"),
    ("kapok/replication/hosting.py", frozenset({"_save"}),
     "by design: a role change takes effect only once the pair state is on disk (a small file, "
     "written and fsynced at role changes only)"),
)  # fmt: skip

OFF_SWITCH: Final = "KAPOK_TEST_BLOCKING"  # =0: no detector (to tell its cost or its part in a failure)
SCANNED: Final = ("kapok",)
NOT_SCANNED: Final = ("kapok.testing",)  # the tests' own helpers
_ASYNC: Final = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


@dataclass
class BlockingCall:
    func: str
    stack: str  # kapok's and the tests' frames, innermost last

    def __str__(self) -> str:
        return f"{self.func} on the event loop, from:\n{self.stack}"


_KAPOK: Final = os.path.dirname(kapok.__file__) + os.sep
_HELPERS: Final = os.path.dirname(kapok.testing.__file__) + os.sep
_TESTS: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _ours(frame: FrameType) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_KAPOK) and not name.startswith(_HELPERS)


def _test_side(frame: FrameType) -> bool:
    return frame.f_code.co_filename.startswith((_TESTS, _HELPERS))


def _a_tests_own_call(frame: FrameType | None) -> bool:
    """Does the innermost stretch of kapok's frames consist of plain functions called from a
    test's code?"""
    while frame is not None and not _ours(frame):
        frame = frame.f_back
    while frame is not None and _ours(frame):
        if frame.f_code.co_flags & _ASYNC:
            return False
        frame = frame.f_back
    return frame is not None and _test_side(frame)


def _stack(frame: FrameType | None) -> str:
    """The frames of kapok and of the tests, and the one that made the call, innermost last."""
    lines = []
    innermost = frame
    while frame is not None:
        if frame is innermost or _ours(frame) or _test_side(frame):
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return "\n".join(reversed(lines[:12]))


@pytest.fixture(autouse=True)
def blocking_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BlockingCall]]:
    """The blocking calls made on the event loop during the test; any still in the list at
    its end fails it (a test that makes one on purpose clears the list)."""
    seen: list[BlockingCall] = []
    if os.environ.get(OFF_SWITCH) == "0":
        yield seen
        return
    wrap = blockbuster_module._wrap_blocking

    def recording_wrap(*args: Any) -> Callable[..., Any]:
        checked, func, name = wrap(*args), args[2], args[3]

        def call(*a: Any, **k: Any) -> Any:
            try:
                return checked(*a, **k)
            except BlockingError:
                caller = sys._getframe(1)
                if not _a_tests_own_call(caller):
                    seen.append(BlockingCall(name, _stack(caller)))
                return func(*a, **k)

        return call

    monkeypatch.setattr(blockbuster_module, "_wrap_blocking", recording_wrap)
    buster = BlockBuster(list(SCANNED), excluded_modules=list(NOT_SCANNED))
    for function in buster.functions.values():
        for filename, names, _why in ALLOWED:
            function.can_block_in(filename, names)
    buster.activate()
    try:
        yield seen
    finally:
        buster.deactivate()
    if seen:
        found = "\n".join(map(str, seen[:5]))
        pytest.fail(
            f"{len(seen)} blocking call(s) on the event loop (the first ones):\n{found}", pytrace=False
        )
