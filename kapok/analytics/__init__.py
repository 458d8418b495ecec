"""Analytics on PySpark: the archive's lifecycle events → per-topic history and latency.

* ``reading``, ``unique``, ``lifecycle``, ``engine``: the per-event work, in Arrow and
  plain Python inside Spark's tasks (no Spark imported: tested in one process);
* ``transforms``: the rules, and the tables made of the engine's figures;
* ``summary``: ``summary.json``, made of those tables;
* ``inputs``: what ``--input`` names (a node's storage dir, an archive folder, files,
  globs, URIs) and ``--since`` durations; checked before Spark starts;
* ``session``: the SparkSession (Java check, local defaults, UTC);
* ``job``: input → engine (in Spark's tasks) → transforms → Parquet and ``summary.json``;
* ``command``: ``kapok analytics`` (progress, ``--watch``);
* ``stream``: ``spark.readStream.format("kapok")``, a Kapok topic as a Spark stream;
* ``bench``: ``python -m kapok.analytics.bench --events N``; ``proctree``, what it
  measures of the job's process tree (memory and CPU, from /proc).

PySpark (with pyarrow, numpy, pandas) is an optional extra
(``pip install 'kapok[analytics]'``): nothing outside this package imports it, and this
package is imported only by ``kapok analytics`` (``tests/unit/test_purity.py`` checks
that the broker never loads it).
"""
