#!/bin/sh
# Lab hosts as containers sharing this machine's kernel: N containers PREFIX-h1..N, each on its
# own network namespace PREFIX1..N (a veth "eth0" into the bridge PREFIXbr, SUBNET.i/24).
#
#   bindings/rdmalab/machines/container/hosts.sh start N [PREFIX]   start (or keep) hosts 1..N        (PREFIX: rlc)
#   bindings/rdmalab/machines/container/hosts.sh stop [PREFIX]      remove every PREFIX-h<i> container, PREFIX<i>
#                                             namespace, PREFIXv<i> veth and PREFIXbr; idempotent
#   bindings/rdmalab/machines/container/hosts.sh status [PREFIX]
#
# The controller reaches host i with execnet:  popen//python=podman exec -i PREFIX-hI /usr/bin/python3
# and bindings/rdmalab/machines/deploy.py ships the agent into it (podman exec / podman cp: bindings/rdmalab/machines/container/machine.py).
#
# Environment: RLC_SUBNET (10.78.0: host i is 10.78.0.i/24), RLC_IMAGE (the image build.sh made),
# RLC_RXE=1 (create an rxe device PREFIXrxeI on each eth0, in its namespace, after setting
# `rdma system set netns exclusive`: needs Linux >= 7.1 for rxe per namespace), RLC_PODMAN_OPTS
# (more `podman run` options), RLC_RUNTIME / RLC_ULIMITS (see common.sh).
set -eu
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

CMD=${1:-}
[ -n "$CMD" ] || usage 2
shift
case "$CMD" in
    start) [ $# -ge 1 ] || usage 2; N=$1; PREFIX=${2:-rlc}
           case "$N" in ''|*[!0-9]*|0) rlc_die "N must be a number >= 1, not '$N'" ;; esac ;;
    stop|status) PREFIX=${1:-rlc} ;;
    -h|--help) usage 0 ;;
    *) usage 2 ;;
esac
# The names this script makes must stay short (interface names: 15 bytes) and must not match
# anybody else's: PREFIX is letters and digits, ending with a letter.
case "$PREFIX" in
    ''|*[!a-z0-9]*|*[0-9]) rlc_die "PREFIX must be lower-case letters and digits ending in a" \
                                   "letter, not '$PREFIX'" ;;
esac
[ ${#PREFIX} -le 8 ] || rlc_die "PREFIX '$PREFIX' is longer than 8 characters"
BRIDGE=${PREFIX}br
SUBNET=${RLC_SUBNET:-10.78.0}

rlc_need_root
rlc_need ip iproute2

# Names of what exists now, one a line: containers PREFIX-h<i>, namespaces PREFIX<i>, veths.
containers() {
    podman ps -a --format '{{.Names}}' 2>/dev/null | grep -E "^$PREFIX-h[0-9]+\$" || true
}
namespaces() { ip netns list | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+\$" || true; }
veths() {
    ip -o link show type veth | awk -F': ' '{print $2}' | sed 's/@.*//' \
        | grep -E "^${PREFIX}v[0-9]+\$" || true
}

stop() {
    for c in $(containers); do
        podman rm -f -t 2 "$c" >/dev/null && rlc_log "removed container $c"
    done
    for v in $(veths); do ip link del "$v" && rlc_log "removed veth $v"; done
    for ns in $(namespaces); do ip netns del "$ns" && rlc_log "removed namespace $ns"; done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link del "$BRIDGE" && rlc_log "removed bridge $BRIDGE"
    fi
}

status() {
    echo "bridge:     $(ip -br link show "$BRIDGE" 2>/dev/null || echo "($BRIDGE absent)")"
    echo "namespaces: $(namespaces | tr '\n' ' ')"
    podman ps -a --filter "name=^$PREFIX-h[0-9]+\$" \
        --format '{{.Names}}  {{.Status}}  {{.Image}}' 2>/dev/null || true
}

start() {
    rlc_need podman podman
    OPTS=$(rlc_podman_opts) || exit 1
    podman image exists "$RLC_IMAGE" \
        || rlc_die "no image $RLC_IMAGE: build it first: bindings/rdmalab/machines/container/build.sh"
    if [ "${RLC_RXE:-0}" = 1 ]; then
        rlc_need rdma iproute2
        # Only while no other network namespace exists (else EBUSY): before ours are made.
        if ! rdma system show 2>/dev/null | grep -q 'netns exclusive'; then
            rdma system set netns exclusive || rlc_die "rdma system set netns exclusive" \
                "failed (it works only while no other network namespace exists, on a kernel" \
                "with RDMA: 'rdma system show')"
        fi
    fi
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge || rlc_die "cannot create the bridge $BRIDGE"
    fi
    ip link set "$BRIDGE" up
    devices=""
    i=1
    while [ "$i" -le "$N" ]; do
        ns=$PREFIX$i veth=${PREFIX}v$i name=$PREFIX-h$i
        [ -e "/run/netns/$ns" ] || ip netns add "$ns"
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip link add "$veth" type veth peer name eth0 netns "$ns" \
                || rlc_die "cannot create the veth $veth <-> $ns:eth0"
        fi
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" addr replace "$SUBNET.$i/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        if [ "${RLC_RXE:-0}" = 1 ] && ! ip netns exec "$ns" rdma link show 2>/dev/null \
                | grep -q "netdev eth0"; then
            ip netns exec "$ns" rdma link add "${PREFIX}rxe$i" type rxe netdev eth0 \
                || rlc_die "cannot create rxe on $ns:eth0 (modprobe rdma_rxe; rxe in a" \
                           "network namespace needs Linux >= 7.1)"
        fi
        i=$((i + 1))
    done
    # The RDMA device nodes, when the kernel has any: a container sees the nodes that exist
    # when it starts (in netns-exclusive mode only its own namespace's device opens).
    [ -d /dev/infiniband ] && devices="--device /dev/infiniband"
    i=1
    while [ "$i" -le "$N" ]; do
        ns=$PREFIX$i name=$PREFIX-h$i
        state=$(podman container inspect --format '{{.State.Status}}' "$name" 2>/dev/null \
                || true)
        if [ "$state" = running ]; then
            rlc_log "$name: running (kept)"
        elif [ -n "$state" ]; then
            podman start "$name" >/dev/null && rlc_log "$name: started again (was $state)"
        else
            t=$(date +%s.%N)
            # NET_ADMIN: nft, ip, rdma in the host's namespace; NET_RAW: ping, raw sockets;
            # IPC_LOCK: pinning memory (ibv_reg_mr) past RLIMIT_MEMLOCK.
            # shellcheck disable=SC2086  # option lists
            podman run -d --name "$name" --hostname "$name" --network "ns:/run/netns/$ns" \
                --cap-add NET_ADMIN --cap-add NET_RAW --cap-add IPC_LOCK \
                --label "rdmalab.labs.engine=$PREFIX" $OPTS $devices ${RLC_PODMAN_OPTS:-} \
                "$RLC_IMAGE" >/dev/null || rlc_die "podman run $name failed (see above)"
            rlc_log "$name: started on $ns ($SUBNET.$i) in" \
                    "$(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}') s"
        fi
        i=$((i + 1))
    done
    i=1
    while [ "$i" -le "$N" ]; do
        echo "$PREFIX-h$i $SUBNET.$i popen//python=podman exec -i $PREFIX-h$i /usr/bin/python3"
        i=$((i + 1))
    done
}

"$CMD"
