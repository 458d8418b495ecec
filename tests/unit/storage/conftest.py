"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.unit.storage.walfiles import FillingDisk


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FillingDisk]:
    yield FillingDisk(monkeypatch)
