"""Kapok: a lightweight, clustered message broker on asyncio and aiohttp.

Importing the package is cheap on purpose (the CLI's ``kapok version`` must not pull
in aiohttp); import what you need from its modules: ``kapok.config``,
``kapok.client``, ``kapok.server``...
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
