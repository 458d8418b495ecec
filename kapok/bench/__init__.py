"""``kapok bench``: load processes against a real node, one table of results.

Modules: ``producers`` and ``consumers`` (raw aiohttp load clients for both protocols),
``clients`` (what those share), ``library`` (the same through ``kapok.client``), ``roles``
(the producer and consumer processes), ``nodes`` and ``proc`` (the node under test, its CPU
and RSS), ``harness`` (options, progress line, process orchestration), ``workloads``,
``soak``, ``runner`` (the matrix), ``report`` (table and JSON), ``options`` and ``command``
(the CLI), ``summary`` (medians and ratios of peer-mode runs), ``storage`` (the WAL's own
benchmark) and ``compare`` (medians and ratios against the peer benchmark, used by
``build/bench-compare.sh``).
"""
