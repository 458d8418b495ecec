"""WebSocket plumbing under the routes: the frame reader, masking, the parser graft,
the outbox and the socket's life cycle."""
