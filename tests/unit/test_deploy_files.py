"""The deployment files under build/: the two cluster examples hold together (every file
valid, ports and directories apart, each slave naming its master), the hosts example
refuses to start without its secrets, and the systemd unit says what the README says."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kapok.config import Config, load_config
from kapok.errors import ConfigError
from kapok.testing.slow import scaled

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "build" / "examples"
PAIRS = (("m1", "s1"), ("m2", "s2"), ("m3", "s3"))
NAMES = [name for pair in PAIRS for name in pair]
SECRETS = {"KAPOK_MQ_SECRET_KEY": "a-long-random-key-0123", "KAPOK_CLUSTER_SECRET": "another-random-key-4567"}


def example(kind: str, env: dict[str, str] | None = None) -> dict[str, Config]:
    return {name: load_config(EXAMPLES / kind / name / "application.yaml", env=env or {}) for name in NAMES}


def test_the_examples_are_the_six_nodes() -> None:
    for kind in ("local", "hosts"):
        assert sorted(p.name for p in (EXAMPLES / kind).iterdir() if p.is_dir()) == sorted(NAMES)


def test_one_host_example_keeps_nodes_apart_and_pairs_them() -> None:
    nodes = example("local")
    assert [c.server.name for c in nodes.values()] == NAMES
    for field in ("server.port", "cluster.bind", "storage.dir", "log.file"):
        section, _, key = field.partition(".")
        values = [getattr(getattr(c, section), key) for c in nodes.values()]
        assert len(set(values)) == len(NAMES), field
    binds = {c.cluster.bind for c in nodes.values()}
    for name, config in nodes.items():
        assert config.cluster.enabled and config.cluster.profile == "fast"
        assert set(config.cluster.seeds) <= binds, name
        assert config.cluster.secret == nodes["m1"].cluster.secret != ()
        assert config.mq.secret_key == nodes["m1"].mq.secret_key
    for master, slave in PAIRS:
        assert nodes[master].replication.role == "master"
        assert nodes[slave].replication.role == "slave"
        assert urlsplit(nodes[slave].replication.master).port == nodes[master].server.port


def test_hosts_example_needs_its_secrets_and_pairs_across_hosts() -> None:
    with pytest.raises(ConfigError, match=r"^mq\.secret_key: refusing to start"):
        load_config(EXAMPLES / "hosts" / "m1" / "application.yaml", env={})
    with pytest.raises(ConfigError, match=r"^cluster\.secret: refusing to start"):
        load_config(
            EXAMPLES / "hosts" / "m1" / "application.yaml", env={"KAPOK_MQ_SECRET_KEY": "a-long-random-key"}
        )
    nodes = example("hosts", SECRETS)
    advertised = {c.cluster.advertise: name for name, c in nodes.items()}
    assert len(advertised) == len(NAMES)
    for name, config in nodes.items():
        assert config.server.host == "0.0.0.0" and config.log.format == "json"
        assert set(config.cluster.seeds) <= set(advertised), name
    for master, slave in PAIRS:
        url = urlsplit(nodes[slave].replication.master)
        master_host = nodes[master].cluster.advertise.rpartition(":")[0]
        assert (url.hostname, url.port) == (master_host, nodes[master].server.port)
        assert nodes[slave].cluster.advertise.rpartition(":")[0] != master_host  # not on one host


def test_secrets_env_example_holds_what_the_hosts_example_needs() -> None:
    text = (EXAMPLES / "hosts" / "secrets.env.example").read_text(encoding="utf-8")
    pairs = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert set(pairs) == set(SECRETS)
    config = load_config(EXAMPLES / "hosts" / "m1" / "application.yaml", env=pairs)
    assert config.cluster.secret and config.mq.secret_key != "test"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(EXAMPLES / "kapok.service", encoding="utf-8")
    return parser


def test_service_unit_runs_the_pyz_with_restarts_limits_and_a_data_directory() -> None:
    service = unit()["Service"]
    pyz = "/usr/bin/python3 /opt/kapok/kapok.pyz"
    assert service["ExecStart"] == f"{pyz} serve -c /etc/kapok/application.yaml"
    assert "kapok.pyz check -c /etc/kapok/application.yaml" in service["ExecStartPre"]
    assert (service["Restart"], service["RestartPreventExitStatus"]) == ("on-failure", "2")
    assert int(service["LimitNOFILE"]) >= 10000
    assert service["StateDirectory"] == "kapok" and service["WorkingDirectory"] == "/var/lib/kapok"
    assert (service["KillSignal"], service["KillMode"]) == ("SIGTERM", "mixed")
    assert service["Environment"] == "SHIV_ROOT=/var/cache/kapok"
    storage_dirs = {c.storage.dir for c in example("hosts", SECRETS).values()}
    assert storage_dirs == {"/var/lib/kapok/data"}  # inside the unit's StateDirectory


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_service_unit_passes_systemd_analyze_verify() -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(EXAMPLES / "kapok.service")],
        capture_output=True, text=True, timeout=scaled(60), check=False,
    )  # fmt: skip
    # verify exits 0 on unknown keys and bad values too; what it says is the verdict.
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr
