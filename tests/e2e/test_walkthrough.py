"""The cluster walkthrough of docs/deployment.md ("A cluster on one host"), executed as written.

Its commands are read from docs/deployment.md (the fenced blocks after each ``<!-- walkthrough:
NAME -->`` marker), never copied here; the example's ports are rewritten to free ones in the
commands and in a copy of ``build/examples/local``, and each block runs in ``bash`` from a
temporary folder as if it were the repository root. A block that watches the cluster is
run again until it prints what the page says it will (with a deadline).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from kapok.launch import wait_for
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
WALKTHROUGH = REPO / "docs" / "deployment.md"
MARKED_BLOCK = re.compile(r"<!-- walkthrough: (\S+) -->\s*```sh\n(.*?)```", re.DOTALL)
STEPS = ("start", "nodes", "publish", "crash", "takeover", "consume", "restart", "give-back", "stop-master",
         "hand-over", "stop")  # fmt: skip
NODES = ("m1", "m2", "m3", "s1", "s2", "s3")
DEADLINE_S = scaled(60.0)


def walkthrough_steps() -> dict[str, str]:
    return dict(MARKED_BLOCK.findall(WALKTHROUGH.read_text(encoding="utf-8")))


def table(output: str) -> dict[str, dict[str, str]]:
    """``kapok cluster nodes``' table, by member name."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("name"):
        return {}
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = [dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=False)) for line in lines[1:]]
    return {row["name"].removesuffix(" *"): row for row in rows if "name" in row}


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Walkthrough:
    def __init__(self, root: Path, rewrite: Callable[[str], str]) -> None:
        self.root = root
        self.steps = {name: rewrite(text) for name, text in walkthrough_steps().items()}
        bin_dir = str(Path(sys.executable).parent)  # `kapok` as installed for the tests
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
        self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "")
        self.pids: set[int] = set()

    def run(self, step: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", self.steps[step]], cwd=self.root, env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=scaled(60), check=False,
        )  # fmt: skip
        for pid_file in self.root.glob("demo/*/pid"):
            self.pids.add(int(pid_file.read_text()))
        return result

    def until(self, step: str, expected: Callable[[str], bool]) -> str:
        """Run ``step`` until its output is as ``expected``; that output."""
        seen: list[str] = []

        def done() -> bool:
            seen.append(self.run(step).stdout)
            return expected(seen[-1])

        try:
            wait_for(done, DEADLINE_S, 0.5)
        except TimeoutError:
            raise AssertionError(f"step {step!r} never printed what was expected:\n{seen[-1]}") from None
        return seen[-1]

    def log(self, node: str) -> str:
        return (self.root / "demo" / node / "kapok.log").read_text(encoding="utf-8")

    def kill_leftovers(self) -> None:
        """Whatever the walkthrough started and did not stop, by PID (each checked to be a node)."""
        for pid in self.pids:
            try:
                process = psutil.Process(pid)
                if "serve" in process.cmdline():
                    os.kill(pid, signal.SIGKILL)
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass


@pytest.fixture
def walkthrough(tmp_path: Path, local_example: Callable[..., Path], port_map: Callable[[str], str]
                ) -> Iterator[Walkthrough]:  # fmt: skip
    local_example(tmp_path)
    walk = Walkthrough(tmp_path, port_map)
    try:
        yield walk
    finally:
        walk.kill_leftovers()


def test_the_page_has_every_step_of_the_walkthrough() -> None:
    assert tuple(walkthrough_steps()) == STEPS


def test_the_walkthrough_runs_as_written_on_six_nodes(walkthrough: Walkthrough) -> None:
    walk = walkthrough
    assert walk.run("start").returncode == 0
    assert len(walk.pids) == len(NODES)

    def formed(out: str) -> bool:
        rows = table(out)
        return (
            sorted(rows) == sorted(NODES)
            and all(row["state"] == "alive" for row in rows.values())
            and all((rows[f"m{i}"]["active"], rows[f"s{i}"]["active"]) == ("True", "False") for i in "123")
            and all((rows[f"s{i}"]["role"], rows[f"s{i}"]["pair"]) == ("slave", f"m{i}") for i in "123")
        )

    walk.until("nodes", formed)

    published = walk.run("publish")
    first, _, rest = published.stdout.partition("\n")
    assert len(json.loads(first)["codes"]) == 1, published
    state = json.loads(rest)
    assert (state["node"], state["active"], state["partner"]) == ("s1", False, "m1")

    walk.run("crash")
    taken = walk.until(
        "takeover",
        lambda out: table(out).get("s1", {}).get("active") == "True" and "now the active master" in out,
    )  # fmt: skip
    assert table(taken)["m1"]["state"] in ("suspect", "dead")
    assert "the master has been silent" in taken  # a takeover, not a hand-over
    consumed = walk.run("consume")
    assert (consumed.returncode, consumed.stdout) == (0, "hello\n"), consumed.stderr

    assert walk.run("restart").returncode == 0
    walk.until(
        "give-back",
        lambda out: table(out).get("m1", {}).get("active") == "True"
        and table(out).get("s1", {}).get("role") == "slave"
        and "now the active master (the master handed over)" in out,
    )  # fmt: skip

    walk.run("stop-master")
    handed = walk.until("hand-over", lambda out: "handed over to" in out and '"active":true' in out)
    assert '"node":"s2"' in handed
    assert "has been silent" not in walk.log("s2")  # s2 led by hand-over, not by takeover

    walk.run("stop")
    wait_for(lambda: not any(map(running, walk.pids)), DEADLINE_S, 0.2)
    for node in NODES:  # every node that ran to the end stopped cleanly
        assert "stopped cleanly" in walk.log(node), node
