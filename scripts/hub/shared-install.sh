#!/usr/bin/env bash
# One course install for every user of a machine (a JupyterHub): PREFIX/course (the sources, read-only),
# PREFIX/venv (one environment from a Python every user can execute), the course kernel registered under
# KERNEL_PREFIX (/usr/local: every user's Jupyter finds it), the learners' servers' settings
# (course_lib/instructor/hub_server.py), and PREFIX/proxy (configurable-http-proxy, with HUB_PROXY=1).
# Re-running it refreshes the sources and is fast when pyproject.toml has not changed.
# SITE (a profile name or .toml path, default generic) renders the job scripts that every new workspace copies
# (PREFIX/course/jobs/*.sbatch) for that site: its partition, modules and GPUs, and this install's python.
# SOLUTIONS_GROUP (an existing Unix group of instructors): solutions/ readable by that group only
# (withhold-solutions.sh), the install mode of a graded workshop.
# usage: [SITE=mysite] [SOLUTIONS_GROUP=instructors] scripts/hub/shared-install.sh PREFIX
set -euo pipefail
PREFIX=${1:?usage: shared-install.sh PREFIX}
KERNEL_PREFIX=${KERNEL_PREFIX:-/usr/local}
# not root's pyenv Python: a venv points at its interpreter, and /root is closed to learners
SHARED_PYTHON=${SHARED_PYTHON:-/usr/bin/python3}
TORCH=${TORCH:-torch==2.13.0}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
say() { echo "[shared-install] $*"; }

[ -x "$SHARED_PYTHON" ] || { say "no $SHARED_PYTHON: set SHARED_PYTHON to a Python 3.10+ every user can run"; exit 2; }
mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)

# the sources: the files git knows (tracked or not ignored), never a venv, runs or outputs
rm -rf "$PREFIX/course.new"; mkdir -p "$PREFIX/course.new"
(cd "$SRC" && git ls-files -z -co --exclude-standard | grep -zv '^\.venv' | tar --null -T - -cf -) \
    | tar -xf - -C "$PREFIX/course.new"
if [ -d "$PREFIX/course/multigpu_course.egg-info" ]; then
    cp -r "$PREFIX/course/multigpu_course.egg-info" "$PREFIX/course.new/"
fi
rm -rf "$PREFIX/course"; mv "$PREFIX/course.new" "$PREFIX/course"

STAMP="$PREFIX/venv/.installed"
if [ ! -f "$STAMP" ] || ! cmp -s "$SRC/pyproject.toml" "$STAMP"; then
    say "building $PREFIX/venv from $SHARED_PYTHON"
    "$SHARED_PYTHON" -m venv "$PREFIX/venv"
    bash "$SRC/scripts/venv-install.sh" "$PREFIX/venv/bin/python" "$TORCH" -e "$PREFIX/course[lab,hub,instructor]"
    cp "$SRC/pyproject.toml" "$STAMP"
else
    say "$PREFIX/venv is up to date"
fi
# compiled once here, so that nothing writes __pycache__ into the install later
"$PREFIX/venv/bin/python" -m compileall -q "$PREFIX/course/course_lib" >/dev/null
"$PREFIX/venv/bin/python" -m ipykernel install --prefix "$KERNEL_PREFIX" --name multigpu-course \
    --display-name "Multi-GPU course" >/dev/null
"$PREFIX/venv/bin/course" write lab-settings --prefix "$PREFIX/venv"
# the learners' servers: the course kernel only, and the course's work counts as activity for the idle culler
"$PREFIX/venv/bin/python" -m course_lib.instructor.hub_server "$PREFIX/venv"
"$PREFIX/venv/bin/course" jobs --site "${SITE:-generic}" --for-install "$PREFIX" --out "$PREFIX/course/jobs" \
    --force >/dev/null

if [ "${HUB_PROXY:-0}" = 1 ] && [ ! -x "$PREFIX/proxy/node_modules/.bin/configurable-http-proxy" ]; then
    say "installing configurable-http-proxy (npm) into $PREFIX/proxy"
    mkdir -p "$PREFIX/proxy"
    npm install --silent --no-audit --no-fund --prefix "$PREFIX/proxy" configurable-http-proxy@5 >/dev/null
fi
chown -R 0:0 "$PREFIX" 2>/dev/null || true
chmod -R a+rX,go-w "$PREFIX"
# a graded workshop: the solutions (and the tests' faulty submissions) for the instructors' group only
if [ -n "${SOLUTIONS_GROUP:-}" ]; then
    bash "$SRC/scripts/hub/withhold-solutions.sh" "$PREFIX/course" "$SOLUTIONS_GROUP"
else
    say "every user can read $PREFIX/course/solutions: for a graded workshop set SOLUTIONS_GROUP (docs/jupyterhub.md)"
fi
say "ready: $PREFIX (course $PREFIX/course, python $PREFIX/venv/bin/python, kernel multigpu-course)"
