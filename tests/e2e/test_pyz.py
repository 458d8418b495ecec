"""The single-file build: ``bash build/pyz.sh`` makes a pyz that serves (console included)
with a Python that has neither Kapok nor any of its dependencies installed.

The interpreter is a fresh virtual environment made without pip (so its site-packages is
empty) and runs the pyz isolated (``-I``: no PYTHON* variables, no user site); that nothing
of the project's own environment leaks in is checked twice: the bare interpreter cannot
import Kapok or aiohttp, and no shared library the running node (or its archiver child) has
loaded comes from the test's environment, while its native wheels come from the pyz.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from kapok.launch import start_node, wait_for
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Bearer test", "Content-Type": "application/json"}


def _http(url: str, body: object | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(
        urllib.request.Request(url, data=data, headers=AUTH), timeout=scaled(10)
    ) as resp:
        return resp.status, resp.read()


def _libraries(pid: int) -> set[str]:
    """Paths of the shared objects (``.so``) mapped into a process."""
    return {m.path for m in psutil.Process(pid).memory_maps(grouped=True) if ".so" in Path(m.path).name}


def test_pyz_serves_with_nothing_installed(tmp_path: Path) -> None:
    pyz, shiv_root = tmp_path / "kapok.pyz", tmp_path / "shiv"
    started = time.monotonic()
    build = subprocess.run(
        ["bash", str(REPO / "build" / "pyz.sh")], env={**os.environ, "OUT": str(pyz)},
        capture_output=True, text=True, timeout=scaled(540), check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    print(f"\n{build.stdout.strip()} (measured: {time.monotonic() - started:.1f} s)")

    venv = [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")]
    subprocess.run(venv, check=True, timeout=scaled(120))
    bare = str(tmp_path / "bare" / "bin" / "python")
    clean = {"PYTHONPATH": None, "PYTHONHOME": None, "VIRTUAL_ENV": None, "SHIV_ROOT": str(shiv_root)}
    probe = subprocess.run(
        [bare, "-I", "-c", "import sys; print(sys.prefix); import aiohttp"],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and "No module named 'aiohttp'" in probe.stderr, probe
    assert probe.stdout.strip() == str(tmp_path / "bare")

    node = start_node(
        tmp_path / "node", python=bare, launcher=("-I", str(pyz)), env=clean, timeout_s=scaled(120)
    )
    try:
        # Publish and consume one message through it (HTTP v1: publish, pull, ack).
        status, body = _http(node.url + "/v1/topics/jobs/messages", {"data": "from the pyz"})
        assert status == 200
        (code,) = json.loads(body)["codes"]
        status, body = _http(node.url + "/v1/topics/jobs/messages?max=1")
        (message,) = json.loads(body)["messages"]
        assert (message["code"], message["data"]) == (code, "from the pyz")
        status, body = _http(node.url + "/v1/topics/jobs/ack", {"group": "default", "codes": [code]})
        assert json.loads(body)["settled"] == 1
        # The console's templates come out of the pyz.
        with urllib.request.urlopen(node.url + "/console/login", timeout=scaled(10)) as resp:
            page = resp.read().decode()
        assert resp.status == 200 and "<form" in page and "secret" in page.lower()

        # Nothing native from the test's environment; orjson (a native wheel) from the pyz,
        # in the node and in its archiver child (once it has imported it).
        def from_pyz(pid: int) -> bool:
            return any(p.startswith(str(shiv_root)) and "orjson" in p for p in _libraries(pid))

        wait_for(lambda: len(psutil.Process(node.pid).children()) == 1, scaled(30))
        processes = [node.pid, psutil.Process(node.pid).children()[0].pid]
        wait_for(lambda: all(from_pyz(pid) for pid in processes), scaled(30))
        for pid in processes:
            leaked = [path for path in _libraries(pid) if path.startswith(sys.prefix)]
            assert not leaked, (pid, leaked)
    finally:
        assert node.stop() == 0, node.output
    assert "stopped cleanly" in node.output
