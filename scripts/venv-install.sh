#!/usr/bin/env bash
# Install packages into the venv of PYTHON: `venv-install.sh PYTHON ARGS...`, ARGS as for `pip install`.
# With uv (from PyPI, put into that venv first), which resolves and fetches in parallel: the course's venv from a
# fresh clone on a 2-core machine took 33 s with an empty uv cache where pip took 66 s. uv reads none of pip's
# settings, so what pip is told to use (pip config: index-url, extra-index-url, find-links such as a folder with
# a local PyTorch CPU wheel, constraint) is passed on. pip when uv cannot be had or fails, and with COURSE_PIP=1
# (a venv over a site's PyTorch: uv would not count the site's packages as installed).
set -euo pipefail
py=${1:?usage: venv-install.sh PYTHON ARGS...}
shift
if [ -z "${COURSE_PIP:-}" ] && "$py" -m pip install -q uv >/dev/null 2>&1; then
    settings=()
    while IFS='=' read -r key value; do
        value=${value#\'}
        value=${value%\'}
        case "${key##*.}" in
            index-url) settings+=(--index-url "$value") ;;
            extra-index-url) for v in $value; do settings+=(--extra-index-url "$v"); done ;;
            find-links) for v in $value; do settings+=(--find-links "$v"); done ;;
            constraint) for v in $value; do settings+=(--constraint "$v"); done ;;
        esac
    done < <("$py" -m pip config list 2>/dev/null)
    if "$(dirname "$py")/uv" pip install -q --python "$py" --compile-bytecode "${settings[@]}" "$@"; then
        exit 0
    fi
    echo "[venv-install] uv failed (above): installing with pip" >&2
fi
exec "$py" -m pip install -q "$@"
