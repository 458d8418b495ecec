"""A small file system of its own for a test's ``storage.dir``: a disk that can fill up."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """``directory`` as a tmpfs of ``size`` (e.g. ``"16m"``) while the block runs; the test
    is skipped, saying why, where mounting is not permitted (not root, a container)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        why = done.stderr.strip() if done.returncode else ""
    except OSError as exc:
        why = str(exc)
    if why:
        pytest.skip(f"a full disk needs a small tmpfs, and mounting one is not permitted here: {why}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
