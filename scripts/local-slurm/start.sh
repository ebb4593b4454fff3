#!/usr/bin/env bash
# scripts/local-slurm/start.sh [--nodes N] DIR
#
# The course's test cluster (tests/conftest.py starts it once per test session; notebook 03 shows it).
# Installs (only if missing) and starts a private, loopback-only, one-node Slurm
# cluster from Debian bookworm packages (slurm-wlm 22.05 + munge): munged,
# slurmctld and slurmd, all run as root.  Everything it writes - slurm.conf,
# gres.conf, munge key/socket, state, spool, logs, pid files - lives under DIR.
# --nodes N (N >= 2): N nodes, each a network namespace with its own private address and host name
# (scripts/local-slurm/netns.sh): node1, node2, ... each run by its own `slurmd -N nodeK`, NodeAddr per
# node in slurm.conf, the controller on the bridge between them. A rank that dials "localhost" there
# reaches its own node, as on a real cluster (docs/two-node-slurm.md).
# Stop it with scripts/local-slurm/stop.sh DIR (by the pids in DIR, never by name).  Clients need SLURM_CONF:
#     source DIR/env.sh        # export SLURM_CONF=DIR/etc/slurm.conf
#
# Knobs (environment variables):
#   SLURM_LAB_CPUS     CPUs the node advertises (default: max(nproc, 4)); more than
#                      the hardware has is fine (SlurmdParameters=config_overrides)
#   SLURM_LAB_GPUS     fake GPUs, gres gpu:N backed by char devices equal to
#                      /dev/null (default 0: GPU requests are rejected at sbatch)
#   SLURM_LAB_NODE     node name; must resolve to a loopback address (default:
#                      `hostname -s` if it resolves to 127.x/::1, else localhost)
#   SLURM_LAB_CTLD_PORT / SLURM_LAB_SLURMD_PORT   (default 6817 / 6818)
#   SLURM_LAB_FRESH    1 (default): when nothing is running yet, wipe old state/spool/
#                      logs first (job ids restart at 1); 0: keep them (job history kept)
#   SLURM_LAB_TIMEOUT  seconds to wait for the node to be idle (default 60)
#   SLURM_LAB_PROBE    1 (default): finish with a real `srun -n 1` step; 0: skip it
#   SLURM_LAB_FIRST_JOB_ID  the first job id (default 1); clusters side by side on one host take ranges of
#                      their own, since a job's MASTER_PORT is derived from its id (10000 + id % 20000)
set -euo pipefail

log() { echo "[local-slurm] $*"; }
die() { echo "[local-slurm] ERROR: $*" >&2; exit 1; }

NODES=1
if [ "${1:-}" = --nodes ]; then NODES=${2:-}; shift 2 || true; fi
[ $# -eq 1 ] || { echo "usage: $0 [--nodes N] DIR" >&2; exit 2; }
[[ $NODES =~ ^[1-8]$ ]] || die "--nodes must be a number from 1 to 8, not '$NODES'"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[ "$(id -u)" = 0 ] || die "must run as root (munged, slurmctld and slurmd run as root here); without root the Slurm tests skip and jobs run on the local engine"
mkdir -p "$1"
DIR=$(cd "$1" && pwd -P)
# unix socket paths (munge socket, slurmstepd sockets in the spool) must stay < 108 chars
[ ${#DIR} -le 60 ] || die "DIR '$DIR' is too long (${#DIR} chars, max 60)"

t_begin=$(date +%s%N)
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

CTLD_PORT=${SLURM_LAB_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_LAB_SLURMD_PORT:-6818}
TIMEOUT=${SLURM_LAB_TIMEOUT:-60}
GPUS=${SLURM_LAB_GPUS:-0}
NPROC=$(nproc)
CPUS=${SLURM_LAB_CPUS:-$(( NPROC > 4 ? NPROC : 4 ))}

export SLURM_CONF="$DIR/etc/slurm.conf"
MUNGE_SOCK="$DIR/munge/munge.socket"

# ---------------------------------------------------------------- helpers
# alive PIDFILE COMM: the pid file names a live (non-zombie) process called COMM
alive() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}
# port_busy PORT: something accepts connections on 127.0.0.1:PORT
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
show_logs() {
    local f
    for f in "$DIR/munge/munged.log" "$DIR/log/slurmctld.log" "$DIR"/log/slurmd*.log; do
        [ -f "$f" ] && { echo "----- tail $f" >&2; tail -n 25 "$f" >&2; }
    done
    return 0
}

# ---------------------------------------------------------------- 1. install
missing=""
for p in munge slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
mkdir -p "$DIR"/{etc,state,spool,log,run}
if [ -n "$missing" ]; then
    command -v apt-get >/dev/null 2>&1 || die "Slurm packages missing ($missing) and no apt-get to install them"
    log "installing:$missing"
    t0=$(date +%s%N)
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } \
        >"$DIR/log/apt-install.log" 2>&1 \
        || { tail -n 20 "$DIR/log/apt-install.log" >&2; die "apt-get install failed"; }
    log "installed in $(ms_since "$t0") ms"
else
    log "packages already installed"
fi

# ---------------------------------------------------------------- 2. config
running=""
alive "$DIR/munge/munged.pid" munged && running="$running munged"
alive "$DIR/run/slurmctld.pid" slurmctld && running="$running slurmctld"
alive "$DIR/run/slurmd.pid" slurmd && running="$running slurmd"
for pidfile in "$DIR"/run/slurmd-node*.pid; do
    [ -e "$pidfile" ] && alive "$pidfile" slurmd && running="$running slurmd(${pidfile##*/})"
done

if [ -z "$running" ]; then
    # ports first, before anything is started
    port_busy "$CTLD_PORT" && die "port $CTLD_PORT is in use (another slurmctld?); set SLURM_LAB_CTLD_PORT"
    if [ "$NODES" = 1 ] && port_busy "$SLURMD_PORT"; then   # (each node namespace has ports of its own)
        die "port $SLURMD_PORT is in use (another slurmd?); set SLURM_LAB_SLURMD_PORT"
    fi
    if [ "${SLURM_LAB_FRESH:-1}" = 1 ]; then
        # old state can hold phantom RUNNING jobs after a crash (kill -9) and DRAINs
        log "fresh start: wiping old state, spool, logs (SLURM_LAB_FRESH=0 keeps them)"
        rm -rf "${DIR:?}"/state/* "${DIR:?}"/spool/* "${DIR:?}"/log/*.log "$DIR/log/jobcomp.txt"
    fi
fi

HOST=$(hostname -s)
if [ "$NODES" -gt 1 ]; then
    # the network first: the controller's address is the bridge's (its name must be this host's name)
    [ -n "$running" ] || bash "$HERE/netns.sh" up "$DIR" "$NODES" || die "could not make the node namespaces (scripts/local-slurm/stop.sh $DIR removes what was made)"
    CTLD_HOST="$HOST($(cat "$DIR/net/bridge_addr"))"
    NODE_LINES=$(awk '{print "NodeName=" $1 " NodeAddr=" $2}' "$DIR/net/nodes")
    NODE="node[1-$NODES]"
    SPOOL="$DIR/spool/%n"; SLURMD_PID="$DIR/run/slurmd-%n.pid"; SLURMD_LOG="$DIR/log/slurmd-%n.log"
elif [ -n "${SLURM_LAB_NODE:-}" ]; then
    NODE=$SLURM_LAB_NODE
elif getent hosts "$HOST" | awk 'NR==1{print $1}' | grep -qE '^(127\.|::1$)'; then
    NODE=$HOST
else
    NODE=localhost    # slurmd is started with -N, so any name works; this one surely is loopback
fi
if [ "$NODES" = 1 ]; then
    getent hosts "$NODE" | awk 'NR==1{print $1}' | grep -qE '^(127\.|::1$)' \
        || die "node name '$NODE' does not resolve to a loopback address"
    CTLD_HOST="localhost(127.0.0.1)"
    NODE_LINES="NodeName=$NODE NodeAddr=127.0.0.1"
    SPOOL="$DIR/spool"; SLURMD_PID="$DIR/run/slurmd.pid"; SLURMD_LOG="$DIR/log/slurmd.log"
fi
MEM=$(awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo)

GRES=""
if [ "$GPUS" -gt 0 ]; then
    mkdir -p "$DIR/fakedev"
    for i in $(seq 0 $((GPUS - 1))); do
        [ -c "$DIR/fakedev/nvidia$i" ] || { rm -f "$DIR/fakedev/nvidia$i"; mknod "$DIR/fakedev/nvidia$i" c 1 3; }
    done
    GRES=" Gres=gpu:$GPUS"
fi

conf_tmp=$(mktemp "$DIR/etc/.slurm.conf.XXXXXX")
cat >"$conf_tmp" <<EOF
# Generated by scripts/local-slurm/start.sh: $NODES node(s), private addresses only, everything under $DIR
ClusterName=localslurm
FirstJobId=${SLURM_LAB_FIRST_JOB_ID:-1}
SlurmctldHost=$CTLD_HOST
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$SLURMD_LOG
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
MpiDefault=none
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
GresTypes=gpu
$(sed "s/\$/ CPUs=$CPUS RealMemory=$MEM$GRES State=UNKNOWN/" <<<"$NODE_LINES")
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
{
    echo "AutoDetect=off"
    if [ "$GPUS" -gt 0 ]; then echo "NodeName=$NODE Name=gpu File=$DIR/fakedev/nvidia[0-$((GPUS - 1))]"; fi
} >"$DIR/etc/gres.conf.new"

if [ -n "$running" ]; then
    if cmp -s "$conf_tmp" "$SLURM_CONF" && cmp -s "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"; then
        log "already running:$running (same config)"
        rm -f "$conf_tmp" "$DIR/etc/gres.conf.new"
    else
        rm -f "$conf_tmp" "$DIR/etc/gres.conf.new"
        die "already running:$running with a different config; run scripts/local-slurm/stop.sh $DIR first"
    fi
else
    mv -f "$conf_tmp" "$SLURM_CONF"
    mv -f "$DIR/etc/gres.conf.new" "$DIR/etc/gres.conf"
fi
chmod 644 "$SLURM_CONF" "$DIR/etc/gres.conf"
echo "export SLURM_CONF=$SLURM_CONF" >"$DIR/env.sh"

# ---------------------------------------------------------------- 3. start
# munged: socket dir must be 0755; --force tolerates group-writable ancestors of DIR
install -d -m 0755 "$DIR/munge"
if [ ! -s "$DIR/munge/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
        || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 600 "$DIR/munge/munge.key"
if ! alive "$DIR/munge/munged.pid" munged; then
    munged --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCK" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed" || { show_logs; die "munged failed to start"; }
fi
for _ in $(seq 50); do munge -n -S "$MUNGE_SOCK" 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
munge -n -S "$MUNGE_SOCK" | unmunge -S "$MUNGE_SOCK" >/dev/null || { show_logs; die "munge does not work"; }

if ! alive "$DIR/run/slurmctld.pid" slurmctld; then
    port_busy "$CTLD_PORT" && die "port $CTLD_PORT is in use (another slurmctld?); set SLURM_LAB_CTLD_PORT"
    rm -f "$DIR/run/slurmctld.pid"
    slurmctld || { show_logs; die "slurmctld failed to start"; }
fi
if [ "$NODES" -gt 1 ]; then
    # one slurmd per node, inside the node's namespaces (its address, host name and /etc/hosts)
    for i in $(seq "$NODES"); do
        alive "$DIR/run/slurmd-node$i.pid" slurmd && continue
        rm -f "$DIR/run/slurmd-node$i.pid"; mkdir -p "$DIR/spool/node$i"
        bash "$HERE/netns.sh" exec "$DIR" "node$i" slurmd -N "node$i" \
            || { show_logs; die "slurmd for node$i failed to start"; }
    done
elif ! alive "$DIR/run/slurmd.pid" slurmd; then
    port_busy "$SLURMD_PORT" && die "port $SLURMD_PORT is in use (another slurmd?); set SLURM_LAB_SLURMD_PORT"
    rm -f "$DIR/run/slurmd.pid"
    slurmd -N "$NODE" || { show_logs; die "slurmd failed to start"; }
fi

# ---------------------------------------------------------------- 4. wait until idle
deadline=$((SECONDS + TIMEOUT)); resumed=0; st=""
while :; do
    # every node's state; one word when all agree (idle), several otherwise
    st=$(sinfo -h -N -n "$NODE" -o %T 2>/dev/null | sort -u | tr '\n' ' ' | sed 's/ $//' || true)
    [ "$(sinfo -h -N -n "$NODE" -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ] || st="registering: $st"
    case "$st" in
        idle|mixed|allocated) break ;;
        *drain*|*drng*)  # e.g. a DRAIN kept in old state from an earlier, different config
            if [ $resumed = 0 ]; then scontrol update NodeName="$NODE" State=RESUME 2>/dev/null || true; resumed=1; fi ;;
    esac
    if [ $SECONDS -ge $deadline ]; then
        sinfo -N -o '%N %T %E' >&2 || true
        show_logs
        die "node $NODE not idle after ${TIMEOUT}s (state '$st')"
    fi
    sleep 0.2
done
log "node(s) $NODE: $st (CPUs=$CPUS each on $NPROC cores, GPUs=$GPUS) after $(ms_since "$t_begin") ms"

# ---------------------------------------------------------------- 5. end-to-end probe: one real step
# (srun/salloc are scheduled at once; the first *batch* job after a start waits ~3 s)
if [ "${SLURM_LAB_PROBE:-1}" = 1 ]; then
    t0=$(date +%s%N)
    if [ "$NODES" = 1 ]; then
        out=$(timeout "$TIMEOUT" srun -J start-probe -n 1 -t 1 printenv SLURM_JOB_ID 2>&1) \
            || { echo "$out" >&2; show_logs; die "probe job (srun -n 1) failed"; }
        log "probe job ${out##*$'\n'} ran in $(ms_since "$t0") ms"
    else   # one task per node, each says which host it ran on: node1, node2, ...
        out=$(timeout "$TIMEOUT" srun -J start-probe -N "$NODES" -n "$NODES" -t 1 --label hostname 2>&1) \
            || { echo "$out" >&2; show_logs; die "probe job (srun -N $NODES hostname) failed"; }
        [ "$(sort -u <<<"$out" | awk '{print $2}' | sort -u | wc -l)" = "$NODES" ] \
            || { echo "$out" >&2; die "probe job: the tasks did not run on $NODES different hosts"; }
        log "probe job ran on $(awk '{print $2}' <<<"$out" | sort | tr '\n' ' ')in $(ms_since "$t0") ms"
    fi
fi
log "pids: munged=$(cat "$DIR/munge/munged.pid") slurmctld=$(cat "$DIR/run/slurmctld.pid") slurmd=$(cat "$DIR"/run/slurmd*.pid | tr '\n' ' ')"
log "use it with:  source $DIR/env.sh   (export SLURM_CONF=$SLURM_CONF)"
