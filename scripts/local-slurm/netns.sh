#!/usr/bin/env bash
# scripts/local-slurm/netns.sh up DIR N | exec DIR NODE CMD... | down DIR
#
# The "machines" of the multi-node test cluster (start.sh --nodes N DIR): one Linux network namespace per
# node, each with its own private address on a bridge in this machine's namespace, so that a rank on node2
# that dials "localhost" reaches node2, not node1, exactly as on a real cluster.
#
#   up DIR N     make N namespaces joined by a bridge: node1 = <net>.11, node2 = <net>.12, ...; the bridge
#                (the controller's side) is <net>.1. Writes DIR/net/hosts (every node resolves every name
#                with it) and DIR/net/nodes ("name address namespace" per line). Every namespace and link is
#                recorded in DIR/net/created the moment it exists, so `down` removes exactly those.
#   exec DIR NODE CMD...   run CMD as NODE: in its network namespace, with its own host name (UTS namespace)
#                and DIR/net/hosts as /etc/hosts (a private mount namespace; /etc/hosts itself is untouched).
#                Not `ip netns exec`: that remounts /sys, and slurmd then finds no /sys/fs/cgroup.
#   down DIR     kill what still runs in each recorded namespace (by pid, from `ip netns pids`), delete the
#                namespaces and links that DIR/net/created names. Safe to run twice.
#
# Only private addresses (10.0.0.0/8), no routes out, no forwarding: traffic stays between the namespaces
# and the bridge. Needs root and the `ip` command (iproute2).
set -euo pipefail

log() { echo "[local-slurm] $*"; }
die() { echo "[local-slurm] ERROR: $*" >&2; exit 1; }
IFNAME=eth1   # the node's interface, the same name on every node (GLOO_SOCKET_IFNAME=eth1 in local-2nodes.toml)

usage() { echo "usage: $0 up DIR N | exec DIR NODE CMD... | down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
[ -d "$2" ] || mkdir -p "$2"
DIR=$(cd "$2" && pwd -P)
NET=$DIR/net
shift 2

# A tag from DIR keeps names apart when several test clusters run at once (link names: at most 15 chars)
TAG=$(printf '%s' "$DIR" | cksum | awk '{printf "%05d", $1 % 100000}')

record() { echo "$1 $2" >>"$NET/created"; }

# free_subnet: the first 10.N.M.0/24 (N, M from the tag, then onwards) that no interface here uses
free_subnet() {
    local used n i
    used=$(ip -4 -o addr show | awk '{print $4}')
    for i in $(seq 0 200); do
        n=$(( (10#$TAG + i * 97) % 38750 ))   # 10.100.0 to 10.254.249: every octet valid
        local net="10.$(( 100 + n / 250 )).$(( n % 250 ))"
        grep -q "^$net\." <<<"$used" || { echo "$net"; return 0; }
    done
    return 1
}

up() {
    local n=$1 net br i ns host_end
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 8 ] || die "nodes must be 1..8, not '$n'"
    command -v ip >/dev/null || die "no 'ip' command (iproute2): cannot make network namespaces"
    [ ! -s "$NET/created" ] || die "$NET/created exists: run '$0 down $DIR' (or stop.sh $DIR) first"
    mkdir -p "$NET"
    : >"$NET/created"; : >"$NET/nodes"
    net=$(free_subnet) || die "no free 10.x.y.0/24 subnet"
    br="csb$TAG"
    ! ip link show "$br" >/dev/null 2>&1 || die "bridge $br exists already: is a cluster of $DIR still up? (stop.sh $DIR)"
    ip link add "$br" type bridge || die "cannot create a bridge (not root, or no network namespaces here?)"
    record link "$br"
    ip addr add "$net.1/24" dev "$br"
    ip link set "$br" up
    {
        echo "127.0.0.1 localhost"
        echo "$net.1 $(hostname -s)"
        for i in $(seq "$n"); do echo "$net.$((10 + i)) node$i"; done
    } >"$NET/hosts"
    for i in $(seq "$n"); do
        ns="cs$TAG-node$i"; host_end="csv${TAG}n$i"
        ip netns add "$ns"
        record netns "$ns"
        ip link add "$host_end" type veth peer name "$IFNAME" netns "$ns"
        record link "$host_end"
        ip link set "$host_end" master "$br" up
        ip -n "$ns" addr add "$net.$((10 + i))/24" dev "$IFNAME"
        ip -n "$ns" link set "$IFNAME" up
        ip -n "$ns" link set lo up
        echo "node$i $net.$((10 + i)) $ns" >>"$NET/nodes"
    done
    echo "$net.1" >"$NET/bridge_addr"
    log "network: $n node namespace(s) on bridge $br ($net.0/24), hosts in $NET/hosts"
}

node_exec() {
    local node=$1 addr ns
    shift
    read -r _ addr ns < <(awk -v n="$node" '$1 == n' "$NET/nodes") || die "no node '$node' in $NET/nodes"
    [ -n "${ns:-}" ] || die "no node '$node' in $NET/nodes"
    # new mount + UTS namespaces inside the node's network namespace: own /etc/hosts and host name
    exec nsenter --net="/var/run/netns/$ns" unshare --mount --uts --propagation private \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' sh "$NET/hosts" "$node" "$@"
}

down() {
    local kind name pids
    [ -s "$NET/created" ] || { log "no network namespaces recorded in $NET: nothing to remove"; return 0; }
    # namespaces first: whatever still runs in one (an orphaned slurmstepd, a rank) is ours; TERM, then KILL
    while read -r kind name; do
        [ "$kind" = netns ] || continue
        pids=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
        if [ -n "${pids// /}" ]; then
            log "stopping what still runs in $name: $pids"
            kill -TERM $pids 2>/dev/null || true
            for _ in $(seq 50); do [ -z "$(ip netns pids "$name" 2>/dev/null)" ] && break; sleep 0.1; done
            pids=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
            [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null || true
        fi
        ip netns del "$name" 2>/dev/null || true
    done <"$NET/created"
    while read -r kind name; do   # the host ends of the veth pairs usually go with their namespace
        [ "$kind" = link ] || continue
        ip link del "$name" 2>/dev/null || true   # gone already, or going
    done <"$NET/created"
    # the kernel takes a deleted namespace's devices down in the background: on a loaded machine a veth's host
    # end was still listed right after (one CI-like run), and gone a moment later; wait up to 30 s
    local left i
    for i in $(seq 300); do
        left=""
        while read -r kind name; do
            case $kind in
                netns) ip netns list | awk '{print $1}' | grep -qx "$name" && left="$left $name" ;;
                link) ip link show "$name" >/dev/null 2>&1 && left="$left $name" ;;
            esac
        done <"$NET/created"
        [ -n "$left" ] || break
        sleep 0.1
    done
    [ -z "$left" ] || die "could not remove:$left"
    log "network: removed $(wc -l <"$NET/created") recorded namespace(s) and link(s)"
    rm -f "$NET/created"
}

case $action in
    up) [ $# -eq 1 ] || usage; up "$1" ;;
    exec) [ $# -ge 2 ] || usage; node_exec "$@" ;;
    down) [ $# -eq 0 ] || usage; down ;;
    *) usage ;;
esac
