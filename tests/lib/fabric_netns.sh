# fabric_netns.sh: network namespaces for fabric tests (sourced by tests/integration/fabric_*.sh
# and tests/bench/fabric_*.sh).
#
# fab_setup N [MTU] makes a hub namespace with a bridge and N node namespaces, node i having
# interface eth0 (MAC 02:00:00:00:00:0i) joined to the bridge by a veth pair; in tcp mode eth0
# gets 10.77.0.i/24 (kernel stack), in dpdk mode it has no address (DPDK's af_packet owns it).
# fab_netem ARGS applies `tc netem ARGS` to every hub-side veth, i.e. to every frame that reaches
# a node. fab_cleanup (installed as an EXIT trap) kills the processes started with fab_bg and
# deletes the namespaces. Needs root. Every helper prints nothing on success.

FAB_ID=${FAB_ID:-$$}
# Killing nodes on purpose makes bash report "... Killed ..." on stderr at a moment of its
# choosing, possibly in the middle of a result line: keep those reports out of the output.
exec 2> >(grep --line-buffered -v -E '^[^ ]*: line [0-9]+: +[0-9]+ Killed' >&2)
FAB_HUB="sfab${FAB_ID}h"
FAB_N=0
FAB_PIDS=()
STRATA=${STRATA:-build/strata}

fab_ns() { echo "sfab${FAB_ID}n$1"; }

fab_cleanup() {
    local p i
    for p in "${FAB_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${FAB_PIDS[@]}"; do wait "$p" 2>/dev/null; done
    FAB_PIDS=()
    for ((i = 1; i <= FAB_N; i++)); do ip netns del "$(fab_ns $i)" 2>/dev/null; done
    ip netns del "$FAB_HUB" 2>/dev/null
    FAB_N=0
}

fab_setup() { # fab_setup N [MTU] [tcp|dpdk]
    local n=$1 mtu=${2:-1500} mode=${3:-tcp} i ns
    fab_cleanup
    ip netns add "$FAB_HUB" || return 1
    ip -n "$FAB_HUB" link add br0 type bridge || return 1
    ip -n "$FAB_HUB" link set br0 mtu "$mtu" up
    for ((i = 1; i <= n; i++)); do
        ns=$(fab_ns $i)
        ip netns add "$ns" || return 1
        ip -n "$FAB_HUB" link add "h$i" mtu "$mtu" type veth peer name eth0 netns "$ns" || return 1
        ip -n "$FAB_HUB" link set "h$i" master br0 up
        ip -n "$ns" link set eth0 address "02:00:00:00:00:0$i" mtu "$mtu" up
        ip -n "$ns" link set lo up
        if [ "$mode" = tcp ]; then ip -n "$ns" addr add "10.77.0.$i/24" dev eth0; fi
        # A bridge forwards only once it is out of the listening state.
        ip -n "$FAB_HUB" link set "h$i" type bridge_slave state 3 2>/dev/null
    done
    ip -n "$FAB_HUB" link set br0 type bridge forward_delay 0 stp_state 0 2>/dev/null
    FAB_N=$n
}

fab_netem() { # fab_netem NETEM ARGS... (on every hub-side veth)
    local i
    for ((i = 1; i <= FAB_N; i++)); do
        tc -n "$FAB_HUB" qdisc replace dev "h$i" root netem "$@" || return 1
    done
}

fab_bg() { # fab_bg NODE LOG CMD... : run CMD in node's namespace in the background
    local node=$1 log=$2
    shift 2
    ip netns exec "$(fab_ns "$node")" "$@" >"$log.out" 2>"$log.err" &
    FAB_PIDS+=($!)
    FAB_LAST=$!
}

fab_wait() { # fab_wait PID SECONDS: wait for PID to exit, kill it after SECONDS; returns its status
    local pid=$1 t=$(( $2 * 10 ))
    while kill -0 "$pid" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

fab_wait_line() { # fab_wait_line FILE REGEX SECONDS
    local t=$(( $3 * 10 ))
    while ! grep -qE "$2" "$1" 2>/dev/null && [ $t -gt 0 ]; do sleep 0.1; t=$((t - 1)); done
    grep -qE "$2" "$1" 2>/dev/null
}

fab_key() { # fab_key FILE: a fresh cluster key
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
    echo >>"$1"
}

# fab_node NODE NAME ROLE ARGS...: start `strata node` on node NODE (address 10.77.0.NODE:7000)
# with the transport in $FAB_TRANSPORT (tcp or dpdk; $FAB_MTU for dpdk's port), logs in
# $W/NAME.out and $W/NAME.err; the pid is left in FAB_LAST.
fab_node() {
    local node=$1 name=$2 role=$3
    shift 3
    local targs=(--transport "${FAB_TRANSPORT:-tcp}" --listen "10.77.0.$node:7000")
    if [ "${FAB_TRANSPORT:-tcp}" = dpdk ]; then
        local mtu=${FAB_MTU:-1500} frame=2048 block=4096
        [ "$mtu" -gt 1500 ] && frame=12288 block=12288
        [ -n "${FAB_IMPAIR:-}" ] && targs+=(--impair "$FAB_IMPAIR")
        targs+=(--mtu "$mtu" --eal "-l 0 --no-pci --no-huge --no-shconf -m 256 --log-level=lib.*:error --vdev=net_af_packet0,iface=eth0,blocksz=$block,framesz=$frame,framecnt=1024,qdisc_bypass=0")
    fi
    fab_bg "$node" "$W/$name" "$STRATA" node --role "$role" "${targs[@]}" "$@"
}

fab_result() { # fab_result NAME: the "complete:"/"failed:" line of a node
    tail -n 1 "$W/$1.out" 2>/dev/null
}
