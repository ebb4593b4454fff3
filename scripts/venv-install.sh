#!/usr/bin/env bash
# Install packages into the venv of PYTHON: `venv-install.sh PYTHON ARGS...`, ARGS as for `pip install`.
# With uv (from PyPI, put into that venv first), which resolves and fetches in parallel: the course's venv on a
# 2-core machine took 6 s with it against 66 s with pip. pip when uv cannot be had, or with COURSE_PIP=1 (a venv
# over a site's PyTorch: uv would not count the site's packages as installed). uv reads none of pip's settings,
# so the folders of wheels pip is told to look in (find-links, e.g. a local PyTorch CPU wheel) are passed on.
set -euo pipefail
py=${1:?usage: venv-install.sh PYTHON ARGS...}
shift
if [ -z "${COURSE_PIP:-}" ] && "$py" -m pip install -q uv >/dev/null 2>&1; then
    links=()
    for link in $("$py" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p"); do
        links+=(--find-links "$link")
    done
    exec "$(dirname "$py")/uv" pip install -q --python "$py" --compile-bytecode "${links[@]}" "$@"
fi
exec "$py" -m pip install -q "$@"
