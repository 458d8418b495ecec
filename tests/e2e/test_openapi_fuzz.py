"""schemathesis against a live node's ``/openapi.json``: whatever it sends, no 5xx.

Every operation of the document is exercised (its coverage, fuzzing and stateful phases)
with the key on every request, on a node whose long-polls are short and whose back-off
after wrong keys is off (the fuzzer sends wrong keys on purpose: with the back-off on,
its own address would soon be made to wait and most operations would only see 429).
The example count is modest so that the run takes seconds; the seed is fixed so that a
failure reproduces (``st run --seed``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kapok.launch import start_node
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_no_request_from_the_fuzzer_gets_a_server_error(tmp_path: Path) -> None:
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    assert st is not None, "schemathesis is in the test extra: pip install -e '.[test]'"
    node = start_node(
        tmp_path / "node",
        "server.long_poll_max_s=0.2",
        "server.auth_backoff_after=1000000",
        "storage.fsync=never",
    )
    try:
        run = subprocess.run(
            [
                st, "run", node.url + "/openapi.json",
                "--checks", "not_a_server_error",
                "--max-examples", "10",
                "--seed", "17",
                "--request-timeout", f"{scaled(10):g}",
                "--header", "Authorization: Bearer test",
                "--header", "secretKey: test",
                "--no-color",
            ],
            cwd=tmp_path, capture_output=True, text=True, timeout=scaled(300),
        )  # fmt: skip
    finally:
        node.stop()
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert "50 passed" in run.stdout or " passed" in run.stdout, report
    assert "Traceback" not in node.output, node.output[-3000:]
