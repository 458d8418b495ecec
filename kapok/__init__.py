"""Kapok: a lightweight, clustered message broker on asyncio and aiohttp.

Importing the package is cheap on purpose (the CLI's ``kapok version`` must not pull
in aiohttp); import what you need from its modules: ``kapok.config``,
``kapok.client``, ``kapok.server``...
"""

__version__ = "0.1.0"

# Every process of a node (the node, its archiver) logs lines of this shape.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

__all__ = ["LOG_FORMAT", "__version__"]
