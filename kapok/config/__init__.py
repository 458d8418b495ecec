"""Kapok's configuration: one frozen dataclass tree and its loader.

Layers, later ones win: the defaults <- ``application.yaml`` <- environment variables
``KAPOK_<SECTION>_<KEY>`` <- ``--set section.key=value`` arguments. Every problem is a
``ConfigError`` whose message starts with the full key path, e.g. ``server.port: expected
an integer between 0 and 65535, got 'abc'``.

* ``schema``: the dataclasses (``Config`` and its sections), their defaults and bounds;
* ``convert``: a mapping to a dataclass of the schema, checked key by key;
* ``validate``: the rules across keys;
* ``load``: the layers above, read and merged (``load_config``);
* ``kapokmq``: a KapokMQ ``application.yaml`` translated to Kapok's keys.

Import the names below from ``kapok.config``.
"""

from kapok.config.load import convert_kapokmq_file, load_config, read_config_file
from kapok.config.schema import (
    DEFAULT_SECRET_KEY,
    ClusterConfig,
    Config,
    ConsoleConfig,
    FrozenMap,
    GossipTuning,
    LogConfig,
    MetricsConfig,
    MqConfig,
    ReplicationConfig,
    ServerConfig,
    StorageConfig,
    TopicOverride,
    env_var_name,
    public_dict,
    usable_memory_bytes,
)
from kapok.config.validate import is_loopback, validate_config

__all__ = [
    "DEFAULT_SECRET_KEY",
    "ClusterConfig",
    "Config",
    "ConsoleConfig",
    "FrozenMap",
    "GossipTuning",
    "LogConfig",
    "MetricsConfig",
    "MqConfig",
    "ReplicationConfig",
    "ServerConfig",
    "StorageConfig",
    "TopicOverride",
    "convert_kapokmq_file",
    "env_var_name",
    "is_loopback",
    "load_config",
    "public_dict",
    "read_config_file",
    "usable_memory_bytes",
    "validate_config",
]
