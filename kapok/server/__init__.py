"""The node's network side: ``make_app(config)`` and the drivers behind each protocol."""
