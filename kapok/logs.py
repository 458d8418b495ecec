"""Logging of a node: one line per record, human or JSON, the node's name on every line,
and never a secret.

``setup_logging(config)`` installs one handler on the process's root logger, from ``log.*``:
standard error, or ``log.file`` rotated by size (the standard library's
``RotatingFileHandler``); format ``human`` or ``json``; the level. The node's name is
known for sure only once the HTTP port is bound (``server.port: 0``), so ``set_node``
updates it then.

Secrets (``mq.secret_key``, every ``cluster.secret``) are masked in every formatted line,
tracebacks included. No code logs them on purpose; the mask makes sure that a future line
(an error echoing a header, a config printed whole) cannot either. The mask ignores case
and also covers a secret's URL-encoded forms: a library's error text may lower-case a URL
(aiohttp does, with the ``user:secret@`` of ``replication.master``) or percent-encode it. The shipped key
``test`` is no secret and is left alone: masking it would mangle every topic called test.

The archiver (a child process, ``kapok.storage.archiver``) does not write the log itself:
it sends its records to the node as JSON lines on its standard error (``setup_child``) and
the node logs them as its own (``relog``), so both processes share one destination, one
format and one rotation, and two processes never rotate the same file.
"""

from __future__ import annotations

import datetime
import logging
import logging.handlers
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote, quote_plus

import orjson

from kapok.errors import ConfigError

if TYPE_CHECKING:
    from kapok.config import Config

__all__ = ["HUMAN_FORMAT", "NodeFormatter", "relog", "set_node", "setup_child", "setup_logging"]

HUMAN_FORMAT = "%(asctime)s %(levelname)s %(node)s %(name)s: %(message)s"
MASK = "(hidden)"


class NodeFormatter(logging.Formatter):
    """Formats a record as one human line or one JSON object, names the node, masks secrets."""

    def __init__(self, *, json: bool, node: str, secrets: Iterable[str] = ()) -> None:
        super().__init__(HUMAN_FORMAT)
        self.json = json
        self.node = node
        kept = {s for s in secrets if s}
        if kept:  # imported here: the archiver's formatter masks nothing and loads no config
            from kapok.config import DEFAULT_SECRET_KEY

            kept.discard(DEFAULT_SECRET_KEY)
        forms = {form for secret in kept for form in (secret, quote(secret, safe=""), quote_plus(secret))}
        # Longest first: a secret that contains another is masked whole.
        self.secrets = sorted(forms, key=len, reverse=True)
        self._pattern = (
            re.compile("|".join(map(re.escape, self.secrets)), re.IGNORECASE) if self.secrets else None
        )

    def format(self, record: logging.LogRecord) -> str:
        record.node = self.node
        if not self.json:
            return self._mask(super().format(record))
        out: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "message": self._mask(record.getMessage()),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = self._mask(record.exc_text)
        return orjson.dumps(out).decode()

    def _mask(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub(MASK, text)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Standard error as it is when a record is written (not when the handler was made),
    so a replaced ``sys.stderr`` (pytest's capture) never leaves a dangling stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


_handler: logging.Handler | None = None  # the handler this module installed, if any


def setup_logging(config: Config, *, node: str | None = None) -> None:
    """Log as ``config.log`` says, under ``node`` (default: the configured node name).
    Calling it again replaces what the previous call installed, and nothing else."""
    global _handler
    cfg = config.log
    handler: logging.Handler
    if cfg.file:
        path = Path(cfg.file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=cfg.max_bytes, backupCount=cfg.backups, encoding="utf-8"
            )
        except OSError as exc:
            raise ConfigError(f"log.file: cannot write {cfg.file!r}: {exc.strerror or exc}") from None
    else:
        handler = _Stderr()
    handler.setFormatter(
        NodeFormatter(
            json=cfg.format == "json",
            node=config.server.node_name if node is None else node,
            secrets=(config.mq.secret_key, *config.cluster.secret),
        )
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
        _handler.close()
    root.addHandler(handler)
    root.setLevel(cfg.level.upper())
    _handler = handler


def set_node(name: str) -> None:
    """The node's name is final (its port is bound): every later line carries it."""
    if _handler is not None and isinstance(_handler.formatter, NodeFormatter):
        _handler.formatter.node = name


# ---------------------------------------------------------------------------------------
# The archiver child and the node's end of its stream


def setup_child(level: str, stream: TextIO | None = None) -> None:
    """In the archiver: every record goes to the node as one JSON line on standard error."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(NodeFormatter(json=True, node=""))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def relog(line: str, fallback: str) -> None:
    """Log one line of the archiver's standard error: a JSON record as the record it was,
    anything else (a crash's traceback, a warning of the interpreter) as an error of the
    ``fallback`` logger."""
    text = line.rstrip("\n")
    if not text.strip():
        return
    try:
        obj = orjson.loads(text)
        name, levelname, message = str(obj["logger"]), str(obj["level"]), str(obj["message"])
        created = datetime.datetime.fromisoformat(obj["time"]).timestamp()
        levelno = logging.getLevelName(levelname)
        if not isinstance(levelno, int):
            raise ValueError(levelname)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        logging.getLogger(fallback).error("%s", text)
        return
    logger = logging.getLogger(name)
    if logger.isEnabledFor(levelno):
        record = logging.makeLogRecord(
            {"name": name, "levelno": levelno, "levelname": levelname, "msg": message,
             "created": created, "msecs": (created % 1) * 1000, "exc_text": obj.get("exc")}
        )  # fmt: skip
        logger.handle(record)


def _iso_time(created: float) -> str:
    """UTC, ISO 8601 with milliseconds: ``2026-11-24T06:49:39.752Z``."""
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
