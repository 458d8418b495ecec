"""The README's examples run as written: its curl quickstart, its Python blocks and its
shell lines, taken from README.md by their ``<!-- readme-example: NAME -->`` markers (never
copied here), against a real node; only the node's URL is put in for the documented default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kapok.launch import NodeProcess, start_node
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

README = Path(__file__).resolve().parents[2] / "README.md"
DOCUMENTED_URL = "http://127.0.0.1:8011"


def example(name: str) -> str:
    pattern = rf"<!-- readme-example: {name} -->\s*```[a-z]*\n(.*?)```"
    match = re.search(pattern, README.read_text(), re.S)
    assert match is not None, f"README.md has no example marked {name!r}"
    return match.group(1)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    base = tmp_path_factory.mktemp("readme")
    proc = start_node(base, f"storage.dir={base / 'data'}")
    try:
        yield proc
    finally:
        proc.stop()


def _run(args: list[str], node: NodeProcess, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    # `kapok` is the console script installed beside this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    result = subprocess.run([*args, code.replace(DOCUMENTED_URL, node.url)], capture_output=True, text=True,
                            timeout=scaled(60), env=env, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result


def test_the_examples_use_the_documented_url() -> None:
    for name in ("curl", "producer", "consumer", "shell", "client-api", "client-sync"):
        assert DOCUMENTED_URL in example(name)
    assert len(example("producer").strip().splitlines()) <= 12


def test_producer_then_consumer_example(node: NodeProcess) -> None:
    produced = _run([sys.executable, "-c"], node, example("producer"))
    assert re.fullmatch(r"stored as [0-9a-f]{32}\n", produced.stdout)
    consumed = _run([sys.executable, "-c"], node, example("consumer"))
    lines = consumed.stdout.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [f"order {i}" for i in range(1, 101)]


def test_client_api_example(node: NodeProcess) -> None:
    lines = _run([sys.executable, "-c"], node, example("client-api")).stdout.splitlines()
    assert sorted(lines) == sorted(f"user-{i % 2} t{i} job {i}" for i in range(1, 7))
    for key in ("user-0", "user-1"):  # one key, one pair: in publish order
        of_key = [line for line in lines if line.startswith(key)]
        assert of_key == sorted(of_key, key=lambda line: int(line.rsplit(" ", 1)[1]))


def test_client_sync_example(node: NodeProcess) -> None:
    lines = _run([sys.executable, "-c"], node, example("client-sync")).stdout.splitlines()
    assert len(lines) == 2 and re.fullmatch(r"stored as [0-9a-f]{32}", lines[0])
    assert lines[1] == "got report 1"


def test_shell_example(node: NodeProcess) -> None:
    result = _run(["bash", "-euo", "pipefail", "-c"], node, example("shell"))
    assert result.stdout.splitlines() == ["hello", "world"]
    assert "sent 2, confirmed 2" in result.stderr


def test_curl_example(node: NodeProcess) -> None:
    result = _run(["bash", "-euo", "pipefail", "-c"], node, example("curl"))
    pulled, acked = result.stdout.splitlines()
    [message] = json.loads(pulled)["messages"]
    assert (message["data"], message["group"]) == ("hello", "default")
    assert json.loads(acked) == {"settled": 1, "unknown": []}
