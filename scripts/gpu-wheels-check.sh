#!/usr/bin/env bash
# The GPU self-check on a machine without internet, from a copy of this repository that carries the wheels of
# `make gpu-wheels` (docs/gpu-check.md, "First run on a borrowed GPU machine"):
#   1. pip installs the wheels (--no-index --no-deps) into a fresh folder, nothing else touched;
#   2. runs `python -m course_lib selftest gpu` with that folder on PYTHONPATH, within what is left of BUDGET
#      seconds after the install,
#      with --require REQUIRE (default cuda-torch: a python whose torch cannot use the GPU exits non-zero);
#   3. copies report.md, report.json and the items' logs (gpu-check-logs.tar.gz) into $OUT when it is set,
#      whatever the check's exit code (the report is rewritten after every item, so a killed run keeps it).
# Usage: scripts/gpu-wheels-check.sh [CHECK ARGS...]   e.g. --only notebook-00,notebook-01 (then REQUIRE=)
# Environment: PY (python3), WHEELS (out/gpu-wheels), REPORT (out/gpu-check), BUDGET (480), REQUIRE (cuda-torch).
# Exit code: the check's (0 passed, 1 a FAIL, 2 bad input, 3 a required item did not pass); 4 when the install fails
# (no wheels at all: nothing is installed, and it says so).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
WHEELS=${WHEELS:-out/gpu-wheels}
REPORT=${REPORT:-out/gpu-check}
BUDGET=${BUDGET:-480}
REQUIRE=${REQUIRE-cuda-torch}
SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT

wheels=$(ls "$WHEELS"/*.whl 2>/dev/null | wc -l)
echo "gpu-wheels-check: $("$PY" -V 2>&1) at $(command -v "$PY"); installing $wheels wheel(s)"
if [ "$wheels" -eq 0 ]; then
    echo "gpu-wheels-check: no wheels in $WHEELS (make gpu-wheels): nothing installed; the notebook items need" \
         "papermill in this python"
elif ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$SITE" "$WHEELS"/*.whl; then
    echo "gpu-wheels-check: the wheels in $WHEELS do not install for this python (built for another version?" \
         "make gpu-wheels GPU_PYTHON=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])'))" >&2
    exit 4
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
timeout -k 5 20 nvidia-smi -L 2>&1 || echo "gpu-wheels-check: nvidia-smi -L failed, timed out (20 s) or is missing"
left=$((BUDGET - SECONDS))      # the install's seconds come out of the budget
if [ "$left" -le 0 ]; then
    echo "gpu-wheels-check: the install took the whole budget of $BUDGET s" >&2
    exit 124
fi
"$PY" -m course_lib selftest gpu --out "$REPORT" --budget "$left" --require "$REQUIRE" "$@"
rc=$?
if [ -n "${OUT:-}" ]; then
    cp "$REPORT"/report.md "$REPORT"/report.json "$OUT"/ 2>/dev/null
    tar czf "$OUT"/gpu-check-logs.tar.gz --exclude='*.pt' -C "$(dirname "$REPORT")" "$(basename "$REPORT")" 2>/dev/null
fi
echo "gpu-wheels-check: exit code $rc"
exit $rc
