#!/usr/bin/env bash
# Download as wheels what the GPU self-check needs on a machine without internet (scripts/gpu-wheels.txt),
# for that machine's Python (GPU_PYTHON, default 3.12) on x86-64 Linux, into DEST (default out/gpu-wheels).
# Only wheels (--only-binary=:all:), no dependencies beyond the list (--no-deps): the list is the whole set.
# Usage: scripts/gpu-wheels.sh [DEST]    (make gpu-wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DEST=${1:-out/gpu-wheels}
GPU_PYTHON=${GPU_PYTHON:-3.12}
LIST=scripts/gpu-wheels.txt
mkdir -p "$DEST"
# pip matches manylinux_2_N tags exactly: name the ones the listed packages publish
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64 \
           manylinux_2_5_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
"$PY" -m pip download --quiet --only-binary=:all: --no-deps --dest "$DEST" --python-version "$GPU_PYTHON" \
    --implementation cp "${platforms[@]}" -r "$LIST"
wanted=$(grep -cv '^\s*\(#\|$\)' "$LIST")
got=$(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l)
echo "gpu-wheels: $got wheel(s) for Python $GPU_PYTHON in $DEST ($(du -sh "$DEST" | cut -f1)); the list has $wanted"
if [ "$got" -lt "$wanted" ]; then
    echo "gpu-wheels: fewer wheels than packages listed: is a wheel for Python $GPU_PYTHON missing?" >&2
    exit 1
fi
