"""The rules across keys, checked on a whole ``Config``."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from kapok.config.convert import build
from kapok.config.schema import DEFAULT_SECRET_KEY, Config, env_var_name
from kapok.errors import ConfigError

__all__ = ["is_loopback", "validate_config"]


def validate_config(config: Config) -> None:
    """Check every value of a ``Config`` (also one built in code) and the rules that
    span keys; raise ``ConfigError`` on the first problem."""
    build(Config, config.to_dict(), "")
    server, mq, cluster, repl = config.server, config.mq, config.cluster, config.replication
    if not server.host:
        raise ConfigError("server.host: must not be empty")
    if bool(server.tls_cert) != bool(server.tls_key):
        raise ConfigError("server.tls_cert: set both server.tls_cert and server.tls_key, or neither")
    if server.public_url and not _is_http_url(server.public_url):
        raise ConfigError(
            "server.public_url: expected an http(s) URL such as https://10.0.0.1:8011, "
            f"or empty for one built from server.host and server.port, got {server.public_url!r}"
        )
    if mq.prefetch > mq.max_prefetch:
        raise ConfigError(f"mq.prefetch: must not be above mq.max_prefetch ({mq.max_prefetch})")
    _check_host_port(cluster.bind, "cluster.bind", min_port=0)
    if cluster.advertise:
        _check_host_port(cluster.advertise, "cluster.advertise", min_port=1)
    for i, seed in enumerate(cluster.seeds):
        _check_host_port(seed, f"cluster.seeds[{i}]", min_port=1)
    if repl.master and repl.role == "master":
        raise ConfigError(
            "replication.master: only a slave names its master; remove it, or set replication.role: slave"
        )
    if repl.role == "slave":
        url = urlsplit(repl.master)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                "replication.master: expected an http(s) URL such as http://10.0.0.1:8011 "
                f"(required when replication.role is slave), got {repl.master!r}"
            )
        if is_loopback(url.hostname) and is_loopback(server.host) and url.port == server.port:
            raise ConfigError(f"replication.master: {repl.master!r} is this node itself (server.port)")
    if not is_loopback(server.host) and mq.secret_key in ("", DEFAULT_SECRET_KEY):
        which = "empty" if not mq.secret_key else f"the default {mq.secret_key!r}"
        raise ConfigError(
            f"mq.secret_key: refusing to start: server.host {server.host!r} is not a loopback "
            f"address and the secret key is {which}; "
            f"set mq.secret_key (or {env_var_name('mq.secret_key')}) to a real secret"
        )
    if any(not key for key in cluster.secret):
        raise ConfigError("cluster.secret: a key must not be empty")
    if cluster.enabled and not cluster.advertise and cluster.bind.rpartition(":")[0] in ("0.0.0.0", "[::]"):
        raise ConfigError(
            f"cluster.advertise: required when cluster.bind is a wildcard address ({cluster.bind!r}): "
            "set the host:port the other nodes reach this one at"
        )
    if cluster.enabled and not cluster.secret and not is_loopback(cluster.bind.rpartition(":")[0]):
        raise ConfigError(
            f"cluster.secret: refusing to start: cluster.bind {cluster.bind!r} is not a loopback "
            "address and the gossip secret is empty; set cluster.secret"
        )


def is_loopback(host: str) -> bool:
    """True for localhost, 127.0.0.0/8 and ::1 (brackets allowed)."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_http_url(value: str) -> bool:
    """``http://`` or ``https://`` (lower case: clients derive ``ws://`` / ``wss://`` from
    it), a host, a valid port if one is given, and no query or fragment."""
    if not value.startswith(("http://", "https://")):
        return False
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return bool(url.hostname) and not url.query and not url.fragment


def _check_host_port(value: str, path: str, *, min_port: int) -> None:
    host, sep, port = value.rpartition(":")
    bare = host.strip("[]")
    ok = bool(sep and bare and port.isdigit() and min_port <= int(port) <= 65535)
    if ok and ":" in bare and not (host.startswith("[") and host.endswith("]")):
        ok = False  # an IPv6 address must be written [addr]:port
    if not ok:
        raise ConfigError(
            f"{path}: expected host:port with a port between {min_port} and 65535, got {value!r}"
        )
