"""The sans-I/O rule: pure modules import no event loop, socket, clock or global randomness."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import kapok

PACKAGE = Path(kapok.__file__).parent
PURE_FILES = sorted(
    [
        *(PACKAGE / "core").glob("*.py"),
        *(PACKAGE / "protocol").glob("*.py"),
        *(
            PACKAGE / "cluster" / f"{name}.py"
            for name in (
                "broadcasts",
                "codec",
                "config",
                "membership",
                "membertable",
                "messages",
                "suspicion",
                "swim",
                "swimstate",
            )
        ),
        *(PACKAGE / "replication" / f"{name}.py" for name in ("backlog", "protocol", "session", "unapplied")),
        PACKAGE / "errors.py",
        PACKAGE / "storage" / "events.py",
        *(PACKAGE / "config").glob("*.py"),
    ]
)
PURE_MODULES = [
    "kapok.core",
    "kapok.protocol.native",
    "kapok.protocol.kapokmq",
    "kapok.protocol.sync",
    "kapok.errors",
    "kapok.config",
    "kapok.cluster.swim",
    "kapok.replication.session",
    "kapok.replication.unapplied",
]
BANNED = {"asyncio", "socket", "aiohttp", "time", "random", "threading", "selectors"}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_file_imports_nothing_banned(path: Path) -> None:
    assert not _imported_roots(path) & BANNED


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_pulls_in_no_io(module: str) -> None:
    # A fresh interpreter, so modules imported by other tests do not count.
    io_modules = ("asyncio", "socket", "aiohttp", "selectors")
    code = f"import sys, {module}; print(','.join(m for m in {io_modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_core_loads_no_other_layer() -> None:
    # The core is the bottom layer: drivers import it, never the other way round.
    code = "import sys, kapok.core.broker; print(' '.join(m for m in sys.modules if m.startswith('kapok.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "kapok.core.broker" in loaded
    other_layers = ("kapok.cluster", "kapok.server", "kapok.storage", "kapok.config")
    assert not [m for m in loaded if m.startswith(other_layers)]


@pytest.mark.parametrize("module", ["kapok.node.app", "kapok.node.runner", "kapok.core", "kapok.cli"])
def test_the_broker_never_loads_spark(module: str) -> None:
    # PySpark is an optional extra and costs a JVM: only `kapok analytics` may load it.
    spark_modules = ("pyspark", "py4j", "pyarrow", "kapok.analytics")
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in sys.modules if m.split('.')[0] in {spark_modules!r} "
        f"or m.startswith('kapok.analytics')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("package", "above"),
    [
        ("kapok.protocol", ("kapok.client", "kapok.server", "kapok.bench", "kapok.replication", "kapok.cli")),
        ("kapok.server", ("kapok.node", "kapok.console", "kapok.cli", "kapok.bench")),
        ("kapok.console", ("kapok.node", "kapok.cli", "kapok.bench")),
        ("kapok.replication", ("kapok.node", "kapok.server", "kapok.console", "kapok.bench", "kapok.launch")),
    ],
)
def test_a_layer_loads_none_above_it(package: str, above: tuple[str, ...]) -> None:
    # The node (kapok.node) assembles the drivers, the console and replication; none of them
    # reaches back up to it or to one another's upper layers.
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module({package!r})\n"
        "for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = [m for m in out.stdout.split() if m.startswith(above)]
    assert loaded == [], f"{package} loads {loaded}"


def test_the_service_drives_the_core_and_knows_no_route() -> None:
    # kapok.service sits beside the core it drives: the routes call it, never the reverse.
    code = "import sys, kapok.service; print(' '.join(m for m in sys.modules if m.startswith('kapok.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    above = ("kapok.server", "kapok.node", "kapok.console", "kapok.replication", "kapok.protocol")
    assert [m for m in out.stdout.split() if m.startswith(above)] == []


RUNTIME = ["core", "protocol", "storage", "cluster", "replication", "server", "client", "console", "node"]


@pytest.mark.parametrize("package", RUNTIME)
def test_no_runtime_package_loads_the_test_helpers(package: str) -> None:
    # kapok.testing (fault injection, simulated networks, manual clocks) serves tests and
    # measuring tools; a node or a client never loads it.
    code = (
        "import importlib, pkgutil, sys\n"
        f"pkg = importlib.import_module('kapok.{package}')\n"
        "for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('kapok.testing', 'kapok.bench')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], f"kapok.{package} loads {out.stdout.split()}"


def test_the_archiver_process_loads_no_broker_no_config_no_asyncio() -> None:
    # Its RSS is part of the node's (a process per node): it needs the record codec and the
    # archive, not the broker, the configuration's YAML or asyncio (9 MB of it, measured).
    code = "import sys, kapok.storage.archiver; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy = ("asyncio", "yaml", "kapok.config", "kapok.core.broker", "kapok.storage.store", "aiohttp")
    loaded = [m for m in out.stdout.split() if m.startswith(heavy)]
    assert loaded == [], f"the archiver loads {loaded}"
