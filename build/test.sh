#!/usr/bin/env bash
# The one command that installs everything the tests need and runs every check:
#   bash build/test.sh [extra pytest arguments...]
# Works on a fresh machine (creates .venv) and from any working directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- how slow this machine is now --------------------------------------------------------
# The tests' time bounds (poll deadlines, reply and start-up time-outs, pytest-timeout's
# limit per test) are set for an ordinary machine and multiplied by KAPOK_TEST_SLOW
# (kapok/testing/slow.py): a loaded machine makes the run slower, not red. Unless it is
# set, it follows the load before the run, plus one CPU's worth for the run's second test
# worker (each runs beside the other): 1 + (the 1-minute load average + 1) per CPU, at most 4.
# (Only bounds grow with it: a test that passes takes no longer.)
if [ -z "${KAPOK_TEST_SLOW:-}" ]; then
    cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
    load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
    KAPOK_TEST_SLOW=$(awk -v load="$load" -v cpus="$cpus" \
        'BEGIN { f = 1 + (load + 1) / cpus; if (f > 4) f = 4; printf "%.2f", f }')
    slow_why="load $load on $cpus CPUs, and a second test worker"
else
    slow_why="set by the caller"
fi
export KAPOK_TEST_SLOW
echo "== KAPOK_TEST_SLOW=$KAPOK_TEST_SLOW ($slow_why): the tests' time bounds are multiplied by it"

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
# Two pytest workers in each run. First the unit tests (CPU only: no server, no process of
# their own). Then the rest: integration, e2e, browser and Spark tests start servers and
# processes and spend most of their time waiting on them (a failure to be detected, a
# takeover, a JVM), so two of them side by side take about half the time of one after the
# other, under a load of about 2 (their bounds are scaled for it, above). Work-stealing
# spreads the long tests (Spark, the fault suite) over both workers as they free up.
# Both under coverage.py (pyproject.toml's [tool.coverage.*]), with every Python process
# the tests start: the xdist workers, the `kapok serve` nodes, the CLI and so on. Each
# writes its data under .cache/coverage/; the report combines them, and it runs whatever
# the tests did: the exit status is the tests' when they failed, else the report's
# (fail_under).
.venv/bin/coverage erase
status=0
.venv/bin/coverage run -m pytest -n 2 tests/unit || status=$?
.venv/bin/coverage run -m pytest -n 2 --dist worksteal --ignore=tests/unit || status=$?
echo "== coverage (HTML: .venv/bin/coverage html, then .cache/coverage/html/index.html)"
report=0
{ .venv/bin/coverage combine --quiet && .venv/bin/coverage report; } || report=$?
exit $((status ? status : report))
