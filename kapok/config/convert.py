"""The type-driven converter: a mapping (parsed YAML) to a dataclass of the schema.

Driven by the field types and the metadata of ``kapok.config.schema``; every problem is a
``ConfigError`` whose message starts with the full key path, e.g. ``server.port: expected
an integer between 0 and 65535, got 'abc'``, and an unknown key names the closest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from kapok.config.schema import FrozenMap
from kapok.errors import ConfigError

__all__ = ["build", "show"]

T = TypeVar("T")


def build(cls: type[T], data: object, path: str) -> T:
    """Make dataclass ``cls`` from a mapping, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(fields)})"
            raise ConfigError(f"{path}{key}: unknown key{hint}")
    values = {
        name: _convert(data[name], hints[name], dict(f.metadata), f"{path}{name}")
        for name, f in fields.items()
        if name in data
    }
    return cls(**values)


def _convert(value: object, tp: Any, meta: dict[str, Any], path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build(typing.cast("type[Any]", tp), {} if value is None else value, path + ".")
    if origin is types.UnionType:  # ``X | None``: TopicOverride and GossipTuning have these
        return None if value is None else _convert(value, args[0], meta, path)
    if origin is Mapping:  # mq.topics: {name: TopicOverride}
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping of topic name to settings, got {show(value)}")
        for name in value:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{path}: topic names must be non-empty strings, got {show(name)}")
        items = ((n, build(args[1], {} if v is None else v, f"{path}.{n}.")) for n, v in value.items())
        return FrozenMap(items)
    if origin is tuple:  # a list of strings; "a, b" is accepted too (handy in env variables)
        if value is None:  # `seeds:` with nothing after it
            value = []
        if isinstance(value, str):
            value = [s.strip() for s in value.split(",") if s.strip()]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings, got {show(value)}")
        return tuple(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {show(value)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {show(value)}")
        return _check_choice(value, meta, path)
    if tp is int or tp is float:
        number: int | float | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value if tp is int else float(value)
        elif tp is float and isinstance(value, float) and math.isfinite(value):
            number = value
        if number is None or not _in_range(number, meta):
            noun = "an integer" if tp is int else "a number"
            raise ConfigError(f"{path}: expected {noun}{_range_text(meta)}, got {show(value)}")
        return _check_choice(number, meta, path)
    raise TypeError(f"{path}: unsupported config field type {tp!r}")  # a bug in this module


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
    return (lo is None or value >= lo) and (hi is None or value <= hi) and (gt is None or value > gt)


def _range_text(meta: Mapping[str, Any]) -> str:
    lo, hi, gt = meta.get("lo"), meta.get("hi"), meta.get("gt")
    if lo is not None and hi is not None:
        return f" between {lo} and {hi}"
    if gt is not None:
        return f" > {gt}"
    return "" if lo is None else f" >= {lo}"


def _check_choice(value: object, meta: Mapping[str, Any], path: str) -> Any:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{path}: expected one of {', '.join(map(show, choices))}, got {show(value)}")
    return value


def show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return f"a {type(value).__name__} ({value!r})"
    return repr(value)
