#!/usr/bin/env bash
# Build dist/kapok.pyz: Kapok and every dependency (native wheels included) in one file,
# made by shiv. Run it with the same Python version and platform it was built on
# (the wheels of orjson, uvloop, pyyaml, psutil... are compiled for them):
#   bash build/pyz.sh && python3 dist/kapok.pyz serve -c application.yaml
# On first start the pyz unpacks its site-packages under $SHIV_ROOT (default ~/.shiv),
# once per build, so the web console's templates are real files there.
# Environment: PYTHON (default .venv/bin/python, else python3) runs shiv; OUT the target.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
out=${OUT:-dist/kapok.pyz}

# shiv is a build tool, not a dependency of Kapok: install it where it runs, when missing.
if ! "$python" -c "import shiv" 2>/dev/null; then
    "$python" -m pip install --quiet --disable-pip-version-check 'shiv>=1.0.8'
fi

mkdir -p "$(dirname "$out")"
started=$(date +%s)
# --extend-pythonpath: the node's child processes (the archiver, `python -m ...`) find the
#   same packages through PYTHONPATH.
# --reproducible: the same sources and wheels give the same file (fixed timestamps).
# -c kapok: the `kapok` console script is the entry point, so the pyz takes kapok's arguments.
"$python" -m shiv \
    --console-script kapok \
    --output-file "$out" \
    --python '/usr/bin/env python3' \
    --compressed \
    --reproducible \
    --extend-pythonpath \
    --quiet \
    --disable-pip-version-check \
    .
size=$(stat -c %s "$out")
echo "built $out: $((size / 1024 / 1024)) MiB ($size bytes) in $(( $(date +%s) - started )) s"
