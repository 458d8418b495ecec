#!/usr/bin/env bash
# The one command that installs everything the tests need and runs every check:
#   bash build/test.sh [extra pytest arguments...]
# Works on a fresh machine (creates .venv) and from any working directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- system packages ---------------------------------------------------------------------
# The browser tests (tests/browser) drive Debian's Chromium (and a font, so that their
# screenshots are legible) through Playwright, which never downloads a browser of its own.
# The analytics tests (tests/spark) need a Java runtime for PySpark (Spark 4: Java 17 or
# 21): Debian's default-jre-headless (OpenJDK 17 on Debian 12, 21 on Debian 13), unless
# JAVA_HOME names one. apt runs only when something is missing.
missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
if [ -z "${JAVA_HOME:-}" ] && ! command -v java >/dev/null 2>&1; then
    missing+=(default-jre-headless)
fi
if ((${#missing[@]})); then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- Python environment ----------------------------------------------------------------
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# The analytics extra (pyspark, pyarrow) too: the Spark tests run, they do not skip.
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,analytics]'

# --- checks ----------------------------------------------------------------------------
echo "== ruff check"
.venv/bin/ruff check kapok tests
echo "== ruff format"
.venv/bin/ruff format --check kapok tests
echo "== mypy (strict, settings in pyproject.toml)"
.venv/bin/mypy kapok tests
echo "== pytest"
if (($#)); then
    exec .venv/bin/pytest "$@"
fi
# The unit tests (CPU only: no server, no process of their own) on both cores; then the
# rest one at a time: integration, e2e, browser and Spark tests start servers and
# processes, and a second worker would only add to the load they are timed under.
status=0
.venv/bin/pytest -n 2 tests/unit || status=$?
.venv/bin/pytest --ignore=tests/unit || status=$?
exit "$status"
