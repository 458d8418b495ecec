"""A pytest plugin: the session's last step kills every process group ``kapok.launch`` started
that is still running, and fails the run when there was any.

A test that fails, or that pytest-timeout interrupts, may never reach the ``finally`` that
stops its nodes; what it started would outlive the run (orphans of PID 1, holding ports and
CPU on a shared machine). Killing them at the end keeps the machine clean; failing the run
(exit status 1, with each left-over command line printed) keeps the leak from going unnoticed,
so the test that caused it gets fixed.

Load it with ``-p kapok.testing.leakcheck``, or import its hooks into a conftest.py. Under
pytest-xdist every worker reaps its own groups and hands the list to the controller, which
reports them all and sets the exit status (a worker's own exit status is not the run's).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kapok.launch import reap_groups

__all__ = ["LEAKS_KEY", "pytest_sessionfinish", "pytest_testnodedown", "report"]

LEAKS_KEY = "kapok_leaked_groups"  # in an xdist worker's workeroutput: group id → command line
_worker_leaks = pytest.StashKey[dict[str, str]]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the xdist controller: keep what a finished worker had to reap."""
    leaks: dict[str, str] = getattr(node, "workeroutput", {}).get(LEAKS_KEY, {})
    if leaks:
        worker = getattr(node, "gateway", None)
        name = getattr(worker, "id", "worker")
        found = node.config.stash.setdefault(_worker_leaks, {})
        found.update({f"{name}:{pgid}": cmd for pgid, cmd in leaks.items()})


# trylast: after pytest's own session teardown (session-scoped fixtures stop their nodes
# there), so only what nobody stopped is left; xdist's worker hook wraps this one and sends
# the workeroutput written here.
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    leaks = {str(pgid): cmd for pgid, cmd in reap_groups().items()}
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports
        workeroutput[LEAKS_KEY] = leaks
        return
    from_workers: dict[str, str] = session.config.stash.get(_worker_leaks, {})
    leaks.update(from_workers)
    if leaks:
        report(session, leaks)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def report(session: pytest.Session, leaks: dict[str, str]) -> None:
    """Print the left-over groups where the run's summary goes."""
    title = f"{len(leaks)} process group(s) started by the tests were still running; killed them"
    lines = [f"group {pgid}: {cmd}" for pgid, cmd in sorted(leaks.items())]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.section(title, sep="=", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print(title, *lines, sep="\n", file=sys.stderr)
