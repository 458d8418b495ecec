"""Reading the configuration: YAML file, environment variables, ``--set`` arguments.

Layers, later ones win: the defaults of ``kapok.config.schema`` <- ``application.yaml``
<- environment variables ``KAPOK_<SECTION>_<KEY>`` <- ``--set section.key=value``
arguments. Override values are parsed as YAML (``[a, b]`` is a list, ``true`` a boolean).
A KapokMQ file is translated first (``kapok.config.kapokmq``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import typing
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kapok.config.convert import build, show
from kapok.config.kapokmq import Note, annotate, is_kapokmq, translate
from kapok.config.schema import Config, TopicOverride, env_var_name
from kapok.config.validate import validate_config
from kapok.errors import ConfigError

__all__ = ["convert_kapokmq_file", "load_config", "read_config_file"]


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    notes: list[Note] | None = None,
) -> Config:
    """Defaults <- YAML file ``path`` <- ``KAPOK_*`` variables of ``env`` (default
    ``os.environ``) <- ``overrides`` (``"section.key=value"``); then validated.

    A KapokMQ file is translated (``kapok.config.kapokmq``); what became of each of its
    keys is appended to ``notes``, for the caller to log."""
    raw: dict[str, Any] = {} if path is None else read_config_file(Path(path), notes)
    for name, value in _env_overrides(os.environ if env is None else env):
        _merge(raw, _nest(name, value))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected path=value, e.g. server.port=8011")
        _merge(raw, _nest(key, _parse_value(key, text, f"--set {key}")))
    config = build(Config, raw, "")
    validate_config(config)
    return config


def read_config_file(path: Path, notes: list[Note] | None = None) -> dict[str, Any]:
    """The mapping of a Kapok file, or the translation of a KapokMQ file (its notes
    appended to ``notes``); a value of the translation that Kapok refuses is reported
    under the KapokMQ key it came from."""
    raw = _read_yaml_file(path)
    if not is_kapokmq(raw):
        return raw
    translation = translate(raw)
    try:
        build(Config, translation.raw, "")
    except ConfigError as exc:
        raise annotate(exc, translation.origin) from None
    if notes is not None:
        notes.append(
            Note("", logging.INFO, f"{path} is a KapokMQ configuration: its keys are translated "
                 f"(`kapok config convert {path}` prints the Kapok file)")
        )  # fmt: skip
        notes.extend(translation.notes)
    return translation.raw


def convert_kapokmq_file(path: Path) -> str:
    """``kapok config convert``: the Kapok file equivalent to KapokMQ file ``path``, each
    key's fate as a comment on top. A file that is not KapokMQ's, or whose translation
    Kapok would refuse, is a ``ConfigError``."""
    notes: list[Note] = []
    raw = read_config_file(path, notes)
    if not notes:
        raise ConfigError(f"{path}: not a KapokMQ configuration (no KapokMQ key); see `kapok check`")
    load_config(path, env={})  # the rules across keys, as `kapok serve` would apply them
    header = [
        f"# Kapok configuration converted from KapokMQ's {path.name} by `kapok config convert`.",
        "# What became of each KapokMQ key:",
        *(f"#   {note.text}" for note in notes if note.key),
    ]
    body = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(header) + "\n\n" + body


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _read_yaml_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: as safe as safe_load
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {show(data)}")
    return data


@functools.cache
def _leaf_paths() -> dict[str, object]:
    """Every settable path (``mq.topics`` counts as one) and its type."""
    out: dict[str, object] = {}

    def walk(cls: type[Any], prefix: str) -> None:
        for name, tp in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(tp):
                walk(typing.cast("type[Any]", tp), f"{prefix}{name}.")
            else:
                out[prefix + name] = tp

    walk(Config, "")
    return out


def _env_overrides(env: Mapping[str, str]) -> list[tuple[str, object]]:
    """``KAPOK_<SECTION>_<KEY>`` variables as (path, value). A ``KAPOK_`` variable that
    does not start with a section name (``KAPOK_HOME``...) is not config and is ignored;
    one that does but names no key is a typo and an error."""
    by_env = {env_var_name(p): p for p in _leaf_paths()}
    sections = tuple(env_var_name(f.name) + "_" for f in dataclasses.fields(Config))
    found: list[tuple[str, object]] = []
    unknown: list[str] = []
    for var in sorted(env):
        if var in by_env:
            found.append((by_env[var], _parse_value(by_env[var], env[var], var)))
        elif var.startswith(sections):
            close = difflib.get_close_matches(var, by_env, n=1)
            unknown.append(var + (f" (did you mean {close[0]}?)" if close else ""))
    if unknown:
        hint = ""
        if any(v.startswith("KAPOK_MQ_TOPICS_") for v in unknown):
            hint = "; per-topic settings go in one variable: KAPOK_MQ_TOPICS='{orders: {max_length: 10}}'"
        raise ConfigError(f"unknown configuration environment variable(s): {', '.join(unknown)}{hint}")
    return found


def _parse_value(path: str, text: str, source: str) -> object:
    """Parse an override as YAML. A string-typed key takes the text as it is unless YAML
    reads it as a string (``'quoted'``), so ``KAPOK_MQ_SECRET_KEY=12345`` and
    ``--set server.host=::`` just work."""
    as_str = _leaf_paths().get(path) is str
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        if as_str:
            return text.strip()
        raise ConfigError(f"{source}: value is not valid YAML: {_yaml_problem(exc)}") from None
    if as_str and not isinstance(value, str):
        return text.strip()
    return value


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def _nest(path: str, value: object) -> dict[str, Any]:
    """``a.b.c`` -> ``{a: {b: {c: value}}}``. Topic names may contain dots: in
    ``mq.topics.orders.eu.max_length`` the last part is the key if it is a known topic
    setting (or the value is not a mapping), and everything between is the topic name."""
    parts = path.split(".")
    if parts[:2] == ["mq", "topics"] and len(parts) > 3:
        known = {f.name for f in dataclasses.fields(TopicOverride)}
        if parts[-1] in known or not isinstance(value, dict):
            parts = [*parts[:2], ".".join(parts[2:-1]), parts[-1]]
        else:
            parts = [*parts[:2], ".".join(parts[2:])]
    out: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        out = {part: out}
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
