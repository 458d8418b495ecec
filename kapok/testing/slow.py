"""How much slower than an ordinary machine the tests run here: ``KAPOK_TEST_SLOW``.

The tests' time bounds (a poll's deadline, how long a node may take to start, stop or
answer, how long a command may run, pytest-timeout's limit per test) are set for an
ordinary, lightly loaded machine. On a loaded one everything takes longer and a bound
that is only a bound, not what a test is about, would fail a test that is merely slow.
So every such bound is written ``scaled(seconds)``: its figure times ``factor()``, read
once from ``KAPOK_TEST_SLOW`` (a number ≥ 1; 1 when unset). A slow machine makes the run
slower, not red. ``build/test.sh`` sets it from the machine's load when it is not set.

What is not scaled: delays and windows that are the subject of a test (a node's
configured time-outs, a latency a test asserts), and the nodes themselves
(``kapok.launch`` leaves ``KAPOK_*`` out of a node's environment).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any

__all__ = ["ENV", "factor", "scale_launch_deadlines", "scale_trial_deadline", "scaled"]

ENV = "KAPOK_TEST_SLOW"


@functools.cache
def factor() -> float:
    """``KAPOK_TEST_SLOW`` as a float ≥ 1 (1 when unset or empty); ValueError otherwise."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r}: not a number") from None
    if not (math.isfinite(value) and value >= 1.0):
        raise ValueError(f"{ENV}={raw!r}: must be a number ≥ 1 (the bounds are set for an ordinary machine)")
    return value


def scaled(seconds: float) -> float:
    """``seconds`` (a bound set for an ordinary machine) times ``factor()``."""
    return seconds * factor()


def _scale_default(func: Callable[..., Any], name: str) -> None:
    """Multiply the default of ``func``'s parameter ``name`` (a number of seconds) by ``factor()``."""
    param = inspect.signature(func).parameters[name]
    if not isinstance(param.default, int | float) or isinstance(param.default, bool):
        raise TypeError(f"{func.__qualname__}({name}=...) has no default number of seconds to scale")
    if param.kind is inspect.Parameter.KEYWORD_ONLY:
        assert func.__kwdefaults__ is not None
        func.__kwdefaults__[name] = scaled(param.default)
        return
    code = func.__code__
    positional = code.co_varnames[: code.co_argcount]
    defaults = list(func.__defaults__ or ())
    defaults[positional.index(name) - (len(positional) - len(defaults))] = scaled(param.default)
    func.__defaults__ = tuple(defaults)


@functools.cache
def scale_launch_deadlines() -> None:
    """Scale the default deadlines of ``kapok.launch``, in this process, once.

    Its helpers are shipped (``kapok bench``, ``kapok local-cluster``) and keep their own
    bounds there; under the tests, which call them with the defaults (``start_cluster``
    and ``start_pair`` pass none down), the defaults are bounds like any other: how long a
    node may take to print "listening on" (``start_node``, 20 s), to stop after SIGTERM
    before its group gets SIGKILL (``NodeProcess.stop``, 10 s), a killed group to be gone
    (``kill_group``, 5 s), a node to answer one request (``get_json``, ``nodes_view``, 2 s).
    """
    from kapok import launch

    _scale_default(launch.start_node, "timeout_s")
    _scale_default(launch.NodeProcess.stop, "timeout_s")
    _scale_default(launch.kill_group, "timeout_s")
    _scale_default(launch.get_json, "timeout_s")
    _scale_default(launch.nodes_view, "timeout_s")


@functools.cache
def scale_trial_deadline() -> None:
    """Scale the deadline of ``kapok.bench.failover``'s trial, in this process, once.

    The trial (a shipped benchmark, ``python -m kapok.bench.failover``) waits up to its
    ``DEADLINE_S`` (30 s) for the pair to pair up, to settle after the fault and for its
    clients to finish; the e2e tests that run it (``tests/e2e/conftest.py``) scale it. Its
    other times (the producer's patience, the health poll's time-out) are what it measures
    with, and stay as they are.
    """
    from kapok.bench import failover

    failover.DEADLINE_S = scaled(failover.DEADLINE_S)
