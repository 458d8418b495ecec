"""``kapok bench``: load processes against a real node, one table of results.

Modules: ``clients`` (raw aiohttp load clients for both protocols), ``roles`` (the producer
and consumer processes), ``nodes`` (the node under test, /proc readings), ``harness``
(options, progress line, process orchestration), ``workloads``, ``runner`` (the matrix),
``report`` (table and JSON), ``command`` (the CLI glue) and ``compare`` (medians and ratios
against the peer benchmark, used by ``build/bench-compare.sh``).
"""
