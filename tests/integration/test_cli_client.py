"""``kapok produce`` / ``kapok consume`` as real processes against a node served in the
test's own event loop: errors at run time as one line, Ctrl-C as one summary line and exit
130, the progress display forced on, and nothing of it when stderr is not a terminal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import Start

from kapok.client import Producer
from kapok.testing import eventually
from kapok.testing.inprocess import RunningApp
from kapok.testing.slow import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]
T = scaled(30.0)  # upper bound of every wait for a process


@dataclass
class Ran:
    code: int
    out: str
    err: str


def _env() -> dict[str, str]:
    """This environment without KAPOK_* settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _interruptible() -> None:
    """In the child before it runs: SIGINT as a terminal gives it. A command started in the
    background by a non-interactive shell (as CI may run the tests) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt, and like any Unix tool it would not stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.asynccontextmanager
async def kapok(*args: str, cwd: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``python -m kapok ARGS`` with pipes on all three streams; killed if still running at the end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kapok", *args, cwd=cwd, env=_env(), preexec_fn=_interruptible,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


async def run(*args: str, cwd: Path, stdin: bytes = b"") -> Ran:
    async with kapok(*args, cwd=cwd) as proc, asyncio.timeout(T):
        out, err = await proc.communicate(stdin)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def assert_one_line_error(ran: Ran, *fragments: str) -> None:
    assert ran.code == 1, ran.err
    assert ran.out == "" and "Traceback" not in ran.err
    (line,) = ran.err.splitlines()
    assert line.startswith("kapok: error: ")
    assert all(fragment in line for fragment in fragments), line


async def node_with(start: Start, topic: str, count: int) -> RunningApp:
    node = await start("cli")
    if count:
        async with Producer([node.url], topic=topic) as producer:
            for i in range(count):
                await producer.send(f"m{i}")
    return node


# --- errors at run time -----------------------------------------------------------------


async def test_no_node_answering_is_one_line_exit_1(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        seed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    for command in ("produce", "consume"):
        ran = await run(command, "--seed", seed, "--topic", "t", cwd=tmp_path, stdin=b"a\n")
        assert_one_line_error(ran, "no node answered", seed)


WRONG_KEY = ("--topic", "t", "--secret", "wrong")
KEY_HINT = "(the key: --secret, else $KAPOK_SECRET, else 'test')"


async def test_a_wrong_key_is_one_line_exit_1(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "t", 0)
    consumed = await run("consume", "--seed", node.url, *WRONG_KEY, cwd=tmp_path)
    assert_one_line_error(consumed, "refused the secret key", KEY_HINT)
    # KapokMQ mode needs the key to find the cluster.
    args = ("--seed", node.url, *WRONG_KEY, "--protocol", "kapokmq")
    produced = await run("produce", *args, cwd=tmp_path, stdin=b"a\n")
    assert_one_line_error(produced, "Secret key matching error", KEY_HINT)
    assert node.broker.stats.published == 0


async def test_a_key_refused_at_the_first_publish_is_one_line_exit_1(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "t", 0)
    # Native mode finds the cluster without the key: the first publish is refused, and the
    # run ends there instead of trying every line.
    produced = await run("produce", "--seed", node.url, *WRONG_KEY, cwd=tmp_path, stdin=b"a\nb\n" * 500)
    assert_one_line_error(produced, "refused the secret key", KEY_HINT)
    assert node.broker.stats.published == 0


# --- Ctrl-C -----------------------------------------------------------------------------


async def test_sigint_stops_produce_with_a_summary_and_130(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "sig", 0)
    lines = 2000
    async with kapok("produce", "--seed", node.url, "--topic", "sig", cwd=tmp_path) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"".join(b"line %d\n" % i for i in range(lines)))
        await proc.stdin.drain()  # and the pipe stays open: produce waits for more
        await eventually(lambda: node.broker.stats.published == lines, timeout_s=T, what="every line stored")
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(T):
            err = (await proc.stderr.read()).decode()
            code = await proc.wait()
    assert code == 130, err
    match = re.fullmatch(r"kapok produce: interrupted: sent (\d+), confirmed (\d+), pending (\d+)\n", err)
    assert match, err
    sent, confirmed, pending = map(int, match.groups())
    assert sent == lines and confirmed + pending == lines  # nothing had failed


async def test_sigint_stops_consume_with_a_summary_and_130(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "sigc", 300)
    async with kapok("consume", "--seed", node.url, "--topic", "sigc", cwd=tmp_path) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        await eventually(lambda: node.broker.stats.acked == 300, timeout_s=T, what="every message acked")
        proc.send_signal(signal.SIGINT)  # while it waits for a message that does not come
        async with asyncio.timeout(T):
            out, err = await proc.communicate()
    assert proc.returncode == 130, err
    assert err.decode() == "kapok consume: interrupted: received 300, acked 300\n"
    assert out.decode().splitlines() == [f"m{i}" for i in range(300)]


# --- progress ---------------------------------------------------------------------------


async def test_progress_forced_on_renders_and_then_the_summary(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "p", 0)
    args = ("--seed", node.url, "--topic", "p", "--progress")
    produced = await run("produce", *args, cwd=tmp_path, stdin=b"x\n" * 5000)
    assert produced.code == 0, produced.err
    assert "\x1b[" in produced.err and "kapok produce" in produced.err and "msg/s" in produced.err
    assert re.search(r"sent [\d,]+ .*confirmed [\d,]+", produced.err)
    assert produced.err.endswith(f"kapok produce: sent 5000, confirmed 5000, retried 0, failed 0\n"
                                 f"confirmed per node:\n  {node.service.node_name}: 5000\n")  # fmt: skip
    consumed = await run("consume", *args, "--count", "5000", cwd=tmp_path)
    assert consumed.code == 0, consumed.err
    assert "received" in consumed.err and "of 5,000" in consumed.err
    assert consumed.err.endswith(
        f"kapok consume: 5000 message(s)\nreceived per node:\n  {node.service.node_name}: 5000\n"
    )
    assert consumed.out == "x\n" * 5000


async def test_no_progress_when_stderr_is_not_a_terminal(start: Start, tmp_path: Path) -> None:
    node = await node_with(start, "q", 0)
    name = node.service.node_name
    produced = await run("produce", "--seed", node.url, "--topic", "q", cwd=tmp_path, stdin=b"a\nb\n")
    assert (produced.code, produced.out) == (0, "")
    assert (
        produced.err
        == f"kapok produce: sent 2, confirmed 2, retried 0, failed 0\nconfirmed per node:\n  {name}: 2\n"
    )
    consumed = await run("consume", "--seed", node.url, "--topic", "q", "--count", "2", cwd=tmp_path)
    assert (consumed.code, consumed.out) == (0, "a\nb\n")
    assert consumed.err == f"kapok consume: 2 message(s)\nreceived per node:\n  {name}: 2\n"
