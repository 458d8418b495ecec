"""Analytics on PySpark: the archive's lifecycle events → per-topic history and latency.

* ``transforms``: pure functions DataFrame → DataFrame (and the summary's shape);
* ``inputs``: what ``--input`` names (a node's storage dir, an archive folder, files,
  globs, URIs) and ``--since`` durations; checked before Spark starts;
* ``session``: the SparkSession (Java check, local defaults, UTC);
* ``job``: input → transforms → Parquet and ``summary.json``;
* ``command``: ``kapok analytics`` (progress, ``--watch``);
* ``stream``: ``spark.readStream.format("kapok")``, a Kapok topic as a Spark stream;
* ``bench``: ``python -m kapok.analytics.bench --events N``.

PySpark is an optional extra (``pip install 'kapok[analytics]'``): nothing outside
this package imports it, and this package is imported only by ``kapok analytics``
(``tests/unit/test_purity.py`` checks that the broker never loads it).
"""
