"""A Kapok node: its HTTP application assembled from the protocol drivers (``kapok.server``),
the console, gossip and replication (``app.py``), and the process that serves it
(``runner.py``). It stands above all of them, so none of them imports it."""
