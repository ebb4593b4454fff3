#!/usr/bin/env bash
# Debian packages the tests use when they can have them: a real Slurm (slurmctld, slurmd, munge) and
# Fashion-MNIST's IDX files, and Chromium for the JupyterHub browser tests (tests/test_hub.py).
# Only as root with apt-get; otherwise the tests that need them skip and say why.
set -u
command -v apt-get >/dev/null 2>&1 || { echo "[system-deps] no apt-get: Slurm and fashion-mnist tests will skip"; exit 0; }
[ "$(id -u)" = 0 ] || { echo "[system-deps] not root: Slurm and fashion-mnist tests will skip"; exit 0; }
missing=""
for p in munge slurmctld slurmd slurm-client dataset-fashion-mnist chromium; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "[system-deps] installing:$missing"
export DEBIAN_FRONTEND=noninteractive
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >/tmp/course-system-deps.log 2>&1 \
    || { echo "[system-deps] apt-get failed (see /tmp/course-system-deps.log): those tests will skip"; exit 0; }
