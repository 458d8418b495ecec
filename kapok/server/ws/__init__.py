"""WebSocket plumbing under the routes: the upgrade and the node's own socket after it,
the RFC 6455 frame reader, the outbox and the socket's life cycle."""
