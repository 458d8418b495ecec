"""The routes of every protocol: KapokMQ-compatible, native v1 (HTTP and WebSocket),
``/sync/v1``, operations, OpenAPI and metrics; each a thin driver of ``kapok.service``."""
