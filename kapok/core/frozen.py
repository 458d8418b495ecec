"""``record``: a frozen dataclass whose frozenness mypy checks instead of every ``__init__``.

A frozen dataclass's generated ``__init__`` sets every field through
``object.__setattr__``, a generic attribute lookup per field: a 13-field
``Published`` record cost 3 to 4 µs to build, more than the rest of storing
its message, and the hot path builds three records per message (published,
delivered, settled) plus the producer's ``Draft``. A plain slotted
dataclass builds in a third of that.

So the classes the hot path builds are declared with ``@record``: mypy
treats them as frozen (``frozen_default``), so assigning a field anywhere in
``kapok/`` fails the strict type check, while at run time they are plain
slotted dataclasses. Equality and hashing stay those of a frozen dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

__all__ = ["record"]

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """Make ``cls`` a slotted dataclass that the type checker holds frozen (a class decorator)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
