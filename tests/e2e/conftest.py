"""What the deployment tests share: the shipped examples with their fixed ports rewritten to
free ones, and KapokMQ's own application.yaml."""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from kapok.testing.slow import scale_trial_deadline

# The failover trial's deadline (test_failover, test_pair_faults run it) is a bound like the
# tests' own: scaled by KAPOK_TEST_SLOW.
scale_trial_deadline()

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "build" / "examples"
# The ports the examples use: HTTP 8011-8016, gossip 8021-8026.
EXAMPLE_PORT = re.compile(r"\b80(?:1[1-6]|2[1-6])\b")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 for TCP and UDP alike (gossip uses both);
    all held open until every one is found, so none is handed out twice."""
    with ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            tcp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            udp = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
        return ports


class PortMap:
    """The examples' fixed ports -> free ones, applied to any text (files, README commands)."""

    def __init__(self) -> None:
        fixed = [*range(8011, 8017), *range(8021, 8027)]
        self.ports = dict(zip(fixed, free_ports(len(fixed)), strict=True))

    def __call__(self, text: str) -> str:
        return EXAMPLE_PORT.sub(lambda m: str(self.ports[int(m.group())]), text)


@pytest.fixture
def port_map() -> PortMap:
    return PortMap()


@pytest.fixture
def local_example(tmp_path: Path, port_map: PortMap) -> Callable[..., Path]:
    """``copy(root)``: ``build/examples/local`` copied to ``root/build/examples/local`` with
    free ports; returns that folder."""

    def copy(root: Path = tmp_path, rewrite: Callable[[str], str] = lambda text: text) -> Path:
        target = root / "build" / "examples" / "local"
        shutil.copytree(EXAMPLES / "local", target)
        for path in target.glob("*/application.yaml"):
            path.write_text(rewrite(port_map(path.read_text(encoding="utf-8"))), encoding="utf-8")
        return target

    return copy


def kapokmq_src() -> Path:
    """KapokMQ's source folder: ``$KAPOKMQ_SRC``, else ``shared/peers/kapokmq/src`` beside
    the repository (where CI's clone has it)."""
    return Path(os.environ.get("KAPOKMQ_SRC") or REPO.parent / "shared" / "peers" / "kapokmq" / "src")


@pytest.fixture
def kapokmq_yaml() -> Path:
    path = kapokmq_src() / "application.yaml"
    if not path.is_file():
        pytest.skip(f"KapokMQ's application.yaml is not at {path} (set KAPOKMQ_SRC to its source folder)")
    return path
