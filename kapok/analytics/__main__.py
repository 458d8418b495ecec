"""``python -m kapok.analytics ARGS``: ``kapok analytics ARGS``.

Also the script spark-submit runs (it takes a file, not a module)::

    spark-submit --master yarn "$(python -c 'import kapok.analytics.__main__ as m; print(m.__file__)')" \\
        --input hdfs://nn/kapok/n1/data --output hdfs://nn/kapok/analytics

Without ``--master`` the job then runs on spark-submit's master, with its settings.
"""

import sys

from kapok.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["analytics", *sys.argv[1:]]))
