"""The ``kapok`` command: version, serve's config resolution, one-line errors."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

import kapok
import kapok.logs
from kapok.cli import _build_parser, main
from kapok.cluster.show import nodes_table
from kapok.config import Config
from kapok.errors import BrokerError
from kapok.testing.slow import scaled

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_kapok(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m kapok ARGS`` in a clean environment (no inherited KAPOK_* settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAPOK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "kapok", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kapok: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


# --- as a subprocess --------------------------------------------------------------------


def test_version_subcommand(tmp_path: Path) -> None:
    result = run_kapok("version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kapok {kapok.__version__}"
    # Whatever the release, it is a PEP 440 public version (what the wheel's metadata takes).
    assert re.fullmatch(r"\d+(\.\d+)+((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", kapok.__version__)


def test_bad_set_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_kapok("serve", "--set", "server.port=abc", cwd=tmp_path)
    assert_one_line_error(result, 2, "server.port: expected an integer between 0 and 65535, got 'abc'")


def test_missing_config_file_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_kapok("serve", "-c", "missing.yaml", cwd=tmp_path)
    assert_one_line_error(result, 2, "missing.yaml", "not found")


def test_usage_error_is_one_line_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(run_kapok("frobnicate", cwd=tmp_path), 2, "frobnicate")
    assert_one_line_error(run_kapok(cwd=tmp_path), 2, "required")


# --- in process, with a fake server runner ----------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Config]:
    """Replace kapok.node.runner with a fake whose ``serve`` records its config."""
    calls: list[Config] = []
    fake = types.ModuleType("kapok.node.runner")
    fake.serve = lambda config, seams=None: calls.append(config)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kapok.node.runner", fake)
    monkeypatch.chdir(tmp_path)
    # `serve` sets up logging for the process: give it back as it was after the test.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(kapok.logs, "_handler", None)
    for name in [k for k in os.environ if k.startswith("KAPOK_")]:
        monkeypatch.delenv(name)
    return calls


def test_serve_without_file_uses_defaults(served: list[Config]) -> None:
    assert main(["serve"]) == 0
    assert served == [Config.default()]


def test_serve_uses_application_yaml_in_cwd(served: list[Config], tmp_path: Path) -> None:
    (tmp_path / "application.yaml").write_text("server: {port: 9999}\n", encoding="utf-8")
    assert main(["serve"]) == 0
    assert served[0].server.port == 9999


def test_serve_config_file_then_env_then_set(
    served: list[Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("server: {port: 1, max_batch: 5}\nmq: {prefetch: 2}\n", encoding="utf-8")
    monkeypatch.setenv("KAPOK_SERVER_PORT", "3")
    monkeypatch.setenv("KAPOK_MQ_PREFETCH", "4")
    assert main(["serve", "--config", str(path), "--set", "server.port=6", "--set", "log.level=debug"]) == 0
    (config,) = served
    assert (config.server.port, config.server.max_batch, config.mq.prefetch) == (6, 5, 4)
    assert config.log.level == "debug"


def test_serve_error_from_runner_is_one_line_exit_1(
    served: list[Config], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def port_in_use(config: Config, seams: object = None) -> None:
        raise OSError(98, "address already in use")

    monkeypatch.setattr(sys.modules["kapok.node.runner"], "serve", port_in_use)
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert err == "kapok: error: [Errno 98] address already in use\n"


def test_serve_broker_error_is_exit_1(
    served: list[Config], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(config: Config, seams: object = None) -> None:
        raise BrokerError("storage directory is locked\nby another node")

    monkeypatch.setattr(sys.modules["kapok.node.runner"], "serve", broken)
    assert main(["serve"]) == 1
    assert capsys.readouterr().err == "kapok: error: storage directory is locked by another node\n"


def test_serve_config_error_is_exit_2_and_runner_not_called(
    served: list[Config], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAPOK_SERVER_HOST", "0.0.0.0")
    assert main(["serve"]) == 2
    assert served == []
    assert capsys.readouterr().err.startswith("kapok: error: mq.secret_key: refusing to start")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "serve" in out and "version" in out
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"kapok {kapok.__version__}\n"


def _free_port() -> int:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_cluster_nodes_unreachable_seed_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert main(["cluster", "nodes", "--seed", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kapok: error: cannot reach http://127.0.0.1:{port}/cluster/nodes")
    assert err.count("\n") == 1
    assert main(["cluster", "nodes", "--seed", "127.0.0.1:8011"]) == 1
    assert "expected an http(s) URL" in capsys.readouterr().err


def test_replication_commands_report_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert main(["replication", "unpair", "--url", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kapok: error: cannot reach http://127.0.0.1:{port}/replication/unpair")
    assert err.count("\n") == 1


def test_cluster_nodes_table() -> None:
    rows = [
        {
            "name": "b",
            "state": "dead",
            "incarnation": 2,
            "role": "master",
            "active": True,
            "pair": None,
            "epoch": 1,
            "http_url": "http://b",
            "gossip_addr": "b:1",
            "version": "1",
            "load": 0.0,
            "self": False,
        },
        {
            "name": "a",
            "state": "alive",
            "incarnation": 0,
            "role": "slave",
            "active": False,
            "pair": "b",
            "epoch": 1,
            "http_url": "http://a",
            "gossip_addr": "a:1",
            "version": "1",
            "load": 3.0,
            "self": True,
        },
    ]
    lines = nodes_table(rows).splitlines()
    assert lines[0].split() == [
        "name",
        "state",
        "incarnation",
        "role",
        "active",
        "pair",
        "epoch",
        "http_url",
        "gossip_addr",
        "version",
        "load",
    ]
    assert lines[1].split() == ["b", "dead", "2", "master", "True", "-", "1", "http://b", "b:1", "1", "0.0"]
    second = ["a", "*", "alive", "0", "slave", "False", "b", "1", "http://a", "a:1", "1", "3.0"]
    assert lines[2].split() == second


# --- kapok check --------------------------------------------------------------------------


def test_check_prints_effective_values_with_secrets_hidden(tmp_path: Path) -> None:
    (tmp_path / "application.yaml").write_text(
        "mq: {secret_key: kq-check-secret}\ncluster: {secret: [gz-check-secret]}\n", encoding="utf-8"
    )
    result = run_kapok("check", "--set", "server.port=9011", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["server"]["port"] == 9011 and effective["log"]["format"] == "human"
    assert effective["mq"]["secret_key"] == effective["cluster"]["secret"] == "(hidden)"
    assert "kq-check-secret" not in result.stdout + result.stderr
    assert "gz-check-secret" not in result.stdout + result.stderr
    assert result.stderr == "kapok: configuration OK (node 127.0.0.1:9011)\n"


@pytest.mark.parametrize(
    ("sets", "fragment"),
    [
        (("cluster.tuning.probe_timeout_s=5",), "cluster.tuning: probe_timeout_s must not exceed"),
        (("log.format=xml",), "log.format: expected one of 'human', 'json', got 'xml'"),
        (("log.backups=0",), "log.backups: expected an integer >= 1, got 0"),
    ],
)
def test_check_of_a_bad_config_is_one_line_exit_2(
    tmp_path: Path, sets: tuple[str, ...], fragment: str
) -> None:
    args = [item for s in sets for item in ("--set", s)]
    assert_one_line_error(run_kapok("check", *args, cwd=tmp_path), 2, fragment)


def test_a_log_file_that_cannot_be_written_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    result = run_kapok("serve", "--set", "log.file=taken/kapok.log", "--set", "server.port=0", cwd=tmp_path)
    assert_one_line_error(result, 2, "log.file: cannot write 'taken/kapok.log'")


# --- kapok produce / consume: bad input -------------------------------------------------


def test_a_seed_without_scheme_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_kapok("produce", "--seed", "127.0.0.1:8011", "--topic", "t", cwd=tmp_path)
    assert_one_line_error(result, 2, "argument --seed: expected an http(s) URL", "'127.0.0.1:8011'")


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("produce", "--seed", "127.0.0.1:8011"),
        ("consume", "--seed", "ftp://127.0.0.1:8011"),
        ("produce", "--seed", "http://127.0.0.1:99999"),
        ("produce", "--topic", ""),
        ("consume", "--topic", "a b"),
        ("produce", "--timeout", "-1"),
        ("produce", "--timeout", "0"),
        ("produce", "--timeout", "nan"),
        ("produce", "--delay", "-5"),
        ("produce", "--delay", "inf"),
        ("produce", "--key", "k" * 256),
        ("consume", "--count", "0"),
        ("consume", "--count", "abc"),
        ("consume", "--timeout", "-1"),
        ("consume", "--timeout", "inf"),
        ("consume", "--prefetch", "0"),
        ("consume", "--prefetch", "1000001"),
        ("consume", "--group", ""),
        ("consume", "--key", "k" * 256),
    ],
)
def test_a_bad_client_option_is_one_line_exit_2(
    command: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing listens on the seed: what the argument check lets through fails with exit 1.
    args = {"--seed": f"http://127.0.0.1:{_free_port()}", "--topic": "t", option: value}
    assert main([command, *(item for pair in args.items() for item in pair)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kapok: error: argument {option}: ") and err.count("\n") == 1, err


def test_client_options_are_checked_and_normalised() -> None:
    parser = _build_parser()
    seed, count, timeout = ["--seed", " http://127.0.0.1:8011/ "], ["--count", "3"], ["--timeout", "1.5"]
    args = parser.parse_args(["consume", *seed, "--topic", "t", *count, *timeout, "--prefetch", "1000000"])
    assert (args.seed, args.count, args.timeout, args.prefetch) == (
        ["http://127.0.0.1:8011"],
        3,
        1.5,
        1_000_000,
    )
    assert args.progress is None  # auto: decided by the terminals
    args = parser.parse_args(["produce", "--seed", "https://[::1]:8011", "--topic", "t", "--no-progress"])
    assert (args.seed, args.delay, args.timeout, args.progress) == (["https://[::1]:8011"], 0.0, 30.0, False)


# --- kapok serve: a port in use ---------------------------------------------------------


def test_http_port_in_use_names_the_address(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_kapok("serve", "--set", f"server.port={port}", "--set", "storage.dir=data", cwd=tmp_path)
    assert_one_line_error(result, 1, f"127.0.0.1:{port}", "server.port", "Address already in use")


def test_gossip_port_in_use_names_the_address(tmp_path: Path) -> None:
    # The gossip port is one number for UDP and TCP: here its TCP side is taken.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sets = ["server.port=0", "storage.dir=data", "cluster.enabled=true", f"cluster.bind=127.0.0.1:{port}"]
        result = run_kapok("serve", *(item for s in sets for item in ("--set", s)), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.splitlines()[-1]  # after the storage's log lines
    assert (
        last == f"kapok: error: cannot bind gossip to 127.0.0.1:{port} (cluster.bind): Address already in use"
    )
