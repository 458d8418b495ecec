"""What a node remembers about its pair across restarts: ``<storage.dir>/replication.json``.

The epoch and its history (``kapok.replication.protocol``) and the partner: its name, its
HTTP URL, and the pairing token, recorded on both sides when a slave first connects. The
token is the pair's proof of identity: every hello must present it, so a node with the key
but not of this pair (a stranger, a wiped slave, a forged client) changes nothing. A master that has never had
a slave confirms writes alone; once paired, sync mode needs the slave, until an operator
undoes the pairing on purpose (``kapok replication unpair``). Written to a temporary file,
fsynced and renamed, so a crash leaves the old state or the new one, never half of one.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from kapok.errors import ReplicationError, StorageError
from kapok.replication.protocol import History, history_from_json

__all__ = ["FIRST_EPOCH", "PairState"]

FIRST_EPOCH = 1
FILE_NAME = "replication.json"


@dataclass(frozen=True, slots=True)
class PairState:
    epoch: int = FIRST_EPOCH
    history: History = ((FIRST_EPOCH, 0),)
    partner: str | None = None  # the other node's name
    partner_url: str | None = None  # its HTTP URL, as it announced it
    leading: bool = False  # this node led its pair when it last changed role (start-up uses it)
    token: str | None = None  # the pairing token, minted by the master at first pairing

    @property
    def paired(self) -> bool:
        return self.partner is not None

    def raised(self, epoch: int, lsn: int) -> PairState:
        """This node leads from ``lsn`` on, at ``epoch`` (higher than any it knew)."""
        return dataclasses.replace(self, epoch=epoch, history=(*self.history, (epoch, lsn)))

    def paired_with(self, name: str | None, url: str | None, token: str | None = None) -> PairState:
        return dataclasses.replace(self, partner=name, partner_url=url, token=token)

    def with_role(self, leading: bool) -> PairState:
        return dataclasses.replace(self, leading=leading)

    def following(self, epoch: int, history: History) -> PairState:
        """This node's log is now a copy of a leader's at ``epoch`` with ``history``."""
        return dataclasses.replace(self, epoch=epoch, history=history, leading=False)

    @staticmethod
    def load(directory: Path, *, leading: bool) -> PairState:
        """The saved state; a node with none starts unpaired at the first epoch, ``leading``
        as its configured role says."""
        path = directory / FILE_NAME
        try:
            raw = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return PairState(leading=leading)
        except (OSError, orjson.JSONDecodeError) as exc:
            raise StorageError(f"{path}: cannot read the pair's state: {exc}") from None
        try:
            history = history_from_json(raw["history"])
            epoch = raw["epoch"]
            partner, url, was_leading = raw.get("partner"), raw.get("partner_url"), raw.get("leading")
            token = raw.get("token")
            if type(epoch) is not int or epoch != history[-1][0]:
                raise ValueError("epoch is not the last of the history")
            if not all(v is None or isinstance(v, str) for v in (partner, url, token)):
                raise ValueError("partner, partner_url and token must be strings")
            if type(was_leading) is not bool:
                raise ValueError("leading must be true or false")
        except (KeyError, TypeError, ValueError, ReplicationError) as exc:
            raise StorageError(f"{path}: not a valid pair state: {exc}") from None
        return PairState(epoch, history, partner, url, was_leading, token)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / FILE_NAME
        tmp = path.with_suffix(".tmp")
        body = {
            "epoch": self.epoch,
            "history": [list(item) for item in self.history],
            "partner": self.partner,
            "partner_url": self.partner_url,
            "leading": self.leading,
            "token": self.token,
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the token is in it
        try:
            os.write(fd, orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
