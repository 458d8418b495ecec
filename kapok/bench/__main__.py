"""``python -m kapok.bench ...``: the same as ``kapok bench ...``."""

import sys

from kapok.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
