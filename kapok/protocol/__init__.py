"""Kapok's three wire protocols, free of I/O: frame types, ``encode_*`` and ``decode_*``.

- ``native``: JSON frames with an ``op`` over ``/v1/ws`` (and the message objects of the
  HTTP v1 API), spoken by the server, the Python client, the benchmark and the tests.
- ``kapokmq``: KapokMQ's producer and consumer frames and its handshake strings, byte for
  byte, so its existing clients keep working.
- ``sync``: the master/slave link's control and binary frames.
- ``fields``: the checks every decoder uses on a decoded JSON object's fields.

Nothing here opens a socket, reads a clock or touches an event loop (the way h11 keeps
HTTP apart from I/O): the server, the client, replication and the benchmark move the
bytes; these modules say what the bytes are.
"""
