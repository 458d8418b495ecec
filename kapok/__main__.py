"""``python -m kapok``: the same as the ``kapok`` command."""

from kapok.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
