"""Kapok's configuration: one frozen dataclass tree and its loader.

``schema`` holds the dataclasses; ``kapokmq`` reads a KapokMQ ``application.yaml``.
Import the names below from ``kapok.config``.
"""

from kapok.config.schema import (
    DEFAULT_SECRET_KEY,
    ClusterConfig,
    Config,
    ConsoleConfig,
    FrozenMap,
    GossipTuning,
    LogConfig,
    MqConfig,
    ReplicationConfig,
    ServerConfig,
    StorageConfig,
    TopicOverride,
    convert_kapokmq_file,
    env_var_name,
    is_loopback,
    load_config,
    public_dict,
    read_config_file,
    usable_memory_bytes,
    validate_config,
)

__all__ = [
    "DEFAULT_SECRET_KEY",
    "ClusterConfig",
    "Config",
    "ConsoleConfig",
    "FrozenMap",
    "GossipTuning",
    "LogConfig",
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
