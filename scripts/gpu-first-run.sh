#!/usr/bin/env bash
# The first run of the course on a GPU machine, in one command that stops itself within LIMIT seconds (default
# 540: 9 minutes, for a 10-minute call) and needs no internet (docs/gpu-check.md, "First run"):
#   1. the raw facts of the machine: nvidia-smi (-L, the full table, topo -m), python/torch/CUDA/cuDNN/NCCL versions;
#   2. scripts/gpu-wheels-check.sh: installs the wheels carried with the tree (out/gpu-wheels, `make gpu-wheels`)
#      into a temporary folder, then every item of `course selftest gpu --all` in order of value (the default
#      plan first, the notebooks last), each only while its estimate fits what is left of the budget;
#   3. the NCCL_DEBUG lines the NCCL items wrote, and the items' logs (gpu-check-logs.tar.gz).
# Everything lands in one folder, FOLDER: $OUT when set (the device machine's folder that comes back), else
# out/gpu-first-run. Read report.md first (docs/gpu-check.md says what else).
# Environment: PY (python3), WHEELS (out/gpu-wheels), LIMIT (540), REQUIRE (cuda-torch), FOLDER.
# Exit code: the check's (0 passed, 1 a FAIL, 3 a required item did not pass, 4 the wheels did not install,
# 124 stopped at LIMIT: the report says which item ran).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
LIMIT=${LIMIT:-540}
FOLDER=${FOLDER:-${OUT:-out/gpu-first-run}}
RESERVE=45          # seconds kept for the wheels' install, the logs' archive and the last facts
mkdir -p "$FOLDER/facts"
FOLDER=$(cd "$FOLDER" && pwd)
FACTS=$FOLDER/facts
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/gpu-first-run.XXXXXX")
trap 'rm -rf "$LOGS"' EXIT
say() { echo "gpu-first-run: $*"; }

# each fact under a deadline of its own: a hung driver costs 20 s, not the run
fact() { local file=$1; shift; { echo "\$ $*"; timeout -k 5 20 "$@" 2>&1; echo "(exit code $?)"; } >>"$FACTS/$file"; }
fact nvidia-smi.txt nvidia-smi -L
fact nvidia-smi.txt nvidia-smi
fact nvidia-smi.txt nvidia-smi topo -m
fact versions.txt uname -a
fact versions.txt "$PY" -c 'import platform, sys; print("python", platform.python_version(), sys.executable)'
fact versions.txt "$PY" -c '
import torch
print("torch", torch.__version__, "CUDA build", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
print("CUDA usable", torch.cuda.is_available(), "GPUs", torch.cuda.device_count())
if torch.cuda.is_available():
    print("NCCL", ".".join(map(str, torch.cuda.nccl.version())))
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}")'
fact versions.txt "$PY" -m pip list --disable-pip-version-check
say "facts in $FACTS after ${SECONDS} s"

budget=$((LIMIT - SECONDS - RESERVE))
if [ "$budget" -le 0 ]; then
    say "no time left for the check (LIMIT=$LIMIT, ${SECONDS} s gone)"; exit 124
fi
# the check stops itself: --budget starts an item only while its estimate fits and cuts deadlines to what is
# left; `timeout` (SIGTERM: the check stops the running item's processes) is the backstop
REPORT=$LOGS/gpu-check BUDGET=$budget OUT=$FOLDER timeout -k 10 $((budget + RESERVE - 15)) \
    bash scripts/gpu-wheels-check.sh --all
rc=$?
[ "$rc" -eq 124 ] && say "stopped at the limit of $LIMIT s: report.md says which item was running"
if [ ! -f "$FOLDER/report.json" ] && [ -f "$LOGS/gpu-check/report.json" ]; then   # killed before the copy
    cp "$LOGS"/gpu-check/report.md "$LOGS"/gpu-check/report.json "$FOLDER"/
    tar czf "$FOLDER"/gpu-check-logs.tar.gz --exclude='*.pt' -C "$LOGS" gpu-check 2>/dev/null
fi
grep -rh "NCCL INFO\|NCCL WARN" "$LOGS"/gpu-check 2>/dev/null | head -400 >"$FACTS/nccl-debug.txt"
say "$(wc -l <"$FACTS/nccl-debug.txt") NCCL_DEBUG line(s) in facts/nccl-debug.txt"
[ $((LIMIT - SECONDS)) -gt 30 ] && fact nvidia-smi-after.txt nvidia-smi
say "exit code $rc after ${SECONDS} s (limit $LIMIT s); read $FOLDER/report.md"
exit $rc
