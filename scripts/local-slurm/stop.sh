#!/usr/bin/env bash
# scripts/local-slurm/stop.sh DIR
#
# Stops the cluster that scripts/local-slurm/start.sh [--nodes N] DIR started: cancels its jobs,
# then stops slurmd (one per node), slurmctld and munged by the pids in their pid files
# (TERM, then KILL after 10 s), then removes the node namespaces and links recorded in DIR/net/created
# (scripts/local-slurm/netns.sh down).  Never matches processes by name.  Safe to run
# when nothing is running.  Keeps DIR (state, logs) for inspection; remove it
# yourself, or start again with SLURM_LAB_FRESH=1.
set -uo pipefail

log() { echo "[local-slurm] $*"; }
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
[ -d "$1" ] || { log "no such directory $1: nothing to stop"; exit 0; }
DIR=$(cd "$1" && pwd -P)
export SLURM_CONF="$DIR/etc/slurm.conf"

# pid_of PIDFILE COMM: print the pid if it names a live (non-zombie) process called COMM
pid_of() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
    echo "$pid"
}

# 1. cancel every job of this cluster while slurmctld/slurmd can still clean up
if pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        log "cancelling jobs: $jobs"
        scancel $jobs 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
fi

# 2. stop the daemons, slurmd first
stop() {  # PIDFILE COMM
    local pid i
    pid=$(pid_of "$1" "$2") || { rm -f "$1"; return 0; }
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 50); do pid_of "$1" "$2" >/dev/null || break; sleep 0.2; done
    if pid_of "$1" "$2" >/dev/null; then
        log "$2 ($pid) ignored TERM for 10 s: KILL"
        kill -KILL "$pid" 2>/dev/null
        for i in $(seq 25); do [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)" = Z ] && break; sleep 0.2; done
    fi
    rm -f "$1"
    log "stopped $2 ($pid)"
}
stop "$DIR/run/slurmd.pid" slurmd
for pidfile in "$DIR"/run/slurmd-node*.pid; do [ -e "$pidfile" ] && stop "$pidfile" slurmd; done
stop "$DIR/run/slurmctld.pid" slurmctld
stop "$DIR/munge/munged.pid" munged

# 3. the node namespaces of a multi-node cluster, and whatever still runs in them
if [ -s "$DIR/net/created" ]; then
    bash "$(dirname "${BASH_SOURCE[0]}")/netns.sh" down "$DIR" || log "WARNING: some namespaces or links remain"
fi

# 4. a slurmstepd that outlived its job would have left its socket in the spool
left=$(find "$DIR/spool" -maxdepth 2 -type s 2>/dev/null)
[ -z "$left" ] || log "WARNING: step sockets remain in $DIR/spool (orphaned slurmstepd?): $left"
exit 0
