"""What ``kapok analytics --input`` names, resolved and checked before Spark starts.

Local inputs are checked here, so that a typo costs a line, not Spark's start-up:

* a node's ``storage.dir`` (it holds ``archive/``, ``wal/`` or ``LOCK``): the files
  of its ``archive/`` (none yet is fine: no events);
* an archive folder (it holds ``archive-*.jsonl``): those files;
* a file, or a glob (``*``, ``?``, ``[``): the files it names;

each of which must be readable and start like an archive (its first line a JSON
object with an ``ev``). Anything with a URI scheme other than ``file:``
(``hdfs://``, ``s3a://`` …) goes to Spark unchecked: it may name what no local
check can see. Such a URI naming a directory is a storage dir too (``hdfs://nn/data``
→ ``hdfs://nn/data/archive``), unless its last segment is ``archive``; a glob or a
``.jsonl`` file goes as it is (name another archive folder by a glob:
``hdfs://nn/x/archive-*.jsonl``). Without ``--output``, the output goes next to the first storage dir:
``<storage.dir>/analytics``, where the console looks for ``summary.json``.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from kapok.errors import AnalyticsError

__all__ = ["ANALYTICS_DIR", "Inputs", "default_output", "parse_duration", "resolve_inputs"]

ANALYTICS_DIR: Final = "analytics"  # under a storage dir: the default output
_ARCHIVE_GLOB: Final = "archive-*.jsonl"
_STORAGE_MARKS: Final = ("archive", "wal", "LOCK")
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_FIRST_LINE_MAX: Final = 1 << 20
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True, slots=True)
class Inputs:
    sources: list[str]  # what Spark reads: local file paths and URIs
    local_files: int  # how many of them are local files
    local_bytes: int
    storage_dir: Path | None  # the first storage dir named, if any


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` or plain seconds → seconds."""
    match = _DURATION.match(text)
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 12h, 7d, 2w)")
    return float(match[1]) * _UNIT_S[match[2]]


def default_output(inputs: Inputs) -> str:
    if inputs.storage_dir is None:
        raise AnalyticsError("--output is needed unless an --input is a node's storage dir")
    return str(inputs.storage_dir / ANALYTICS_DIR)


def resolve_inputs(specs: Sequence[str]) -> Inputs:
    """The sources of ``specs``; ``AnalyticsError`` for a missing, unreadable or foreign input."""
    sources: list[str] = []
    storage_dir: Path | None = None
    files = 0
    size = 0
    for spec in specs:
        if _SCHEME.match(spec) and not spec.startswith("file://"):
            sources.append(_remote_source(spec))
            continue
        local = spec.removeprefix("file://")
        found, is_storage = _local_files(local)
        if is_storage and storage_dir is None:
            storage_dir = Path(local)
        for path in found:
            size += _check_archive_file(path)
            sources.append(str(path))
            files += 1
    return Inputs(sources, files, size, storage_dir)


def _remote_source(uri: str) -> str:
    """What Spark reads for a URI no local check can see: a storage dir's ``archive/``.

    A URI naming a directory (no glob, last segment neither ``archive`` nor a file's
    ``….jsonl``) is a node's storage dir, as ``--output`` defaults and the console assume.
    """
    path = urlsplit(uri).path.rstrip("/")
    last = path.rsplit("/", 1)[-1]
    if glob.has_magic(path) or last in ("", "archive") or last.endswith(".jsonl"):
        return uri
    return uri.rstrip("/") + "/archive"


def _local_files(spec: str) -> tuple[list[Path], bool]:
    """The archive files ``spec`` names, and whether it is a storage dir."""
    if glob.has_magic(spec):
        matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(spec)))
        if not matches:
            raise AnalyticsError(f"input {spec}: no file matches")
        out: list[Path] = []
        for match in matches:
            out.extend(_local_files(str(match))[0] if match.is_dir() else [match])
        return out, False
    path = Path(spec).expanduser()
    if not path.exists():
        raise AnalyticsError(f"input {spec}: no such file or directory")
    if not path.is_dir():
        return [path], False
    if not os.access(path, os.R_OK | os.X_OK):
        raise AnalyticsError(f"input {spec}: cannot read the directory (permission denied)")
    if any((path / mark).exists() for mark in _STORAGE_MARKS):
        archive = path / "archive"
        return (sorted(archive.glob(_ARCHIVE_GLOB)) if archive.is_dir() else []), True
    found = sorted(path.glob(_ARCHIVE_GLOB))
    if not found:
        raise AnalyticsError(
            f"input {spec}: not an archive (no archive-*.jsonl files, and not a node's storage dir)"
        )
    return found, False


def _check_archive_file(path: Path) -> int:
    """The file's size, once its first line reads as an archive event."""
    try:
        with path.open("rb") as file:
            first = file.readline(_FIRST_LINE_MAX)
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise AnalyticsError(f"input {path}: cannot read it ({exc.strerror or exc})") from exc
    if not first.endswith(b"\n"):
        return size  # empty, or one line a crash cut: nothing to judge it by
    try:
        event = json.loads(first)
    except ValueError:
        event = None
    if not isinstance(event, dict) or not isinstance(event.get("ev"), str):
        raise AnalyticsError(f"input {path}: not an archive (its first line is not a lifecycle event)")
    return size
