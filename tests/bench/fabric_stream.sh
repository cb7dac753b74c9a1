#!/bin/bash
# Fabric benchmarks on a veth pair in network namespaces (jumbo MTU 9000):
#   1. streaming a 128 MiB synthetic image source -> joiner over kernel TCP, then over DPDK
#      (net_af_packet) on the same veth pair, beside the raw AF_PACKET rate measured in the same
#      run (the ceiling of any af_packet transport here);
#   2. time to replicate to 1, 2 and 3 chain nodes over DPDK (source -> n1 -> n2 -> n3).
# Figures only: on this machine they vary 10x from run to run (2 shared cores, software veth,
# no NIC), so nothing here is a pass/fail threshold. On real hardware the target is >= 90% of the
# link rate; that needs a real NIC (and DPDK on its PMD, not af_packet).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
if [ "$(id -u)" != 0 ]; then echo "skip - fabric_stream: needs root"; exit 0; fi
make -s -j2 all >/dev/null || exit 1
W=$(mktemp -d /tmp/fabric_bench.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
fab_key "$W/key"
SIZE=${FABRIC_BENCH_SIZE:-128M}
T=120

rate() { sed -n 's/.*verified in \([0-9.]*\) s (\([0-9.]*\) MB\/s).*/\1 s, \2 MB\/s/p' "$W/$1.out"; }

one_stream() { # one_stream TRANSPORT: source on node 1, joiner on node 2
    FAB_TRANSPORT=$1 FAB_MTU=9000
    fab_node 1 src source --key-file "$W/key" --synthetic "$SIZE:34:1" --exit-after 1 --chunk 1048000 --timeout $T -q
    local s=$FAB_LAST
    fab_node 2 j joiner --key-file "$W/key" --peer 10.77.0.1:7000 --chunk 1048000 --timeout $T -q
    fab_wait "$FAB_LAST" $T
    fab_wait "$s" 5
    echo "  $1: $SIZE in $(rate j)   [$(grep '^stats' "$W/j.out" | cut -c8-)]"
}

echo "veth pair, MTU 9000, $SIZE synthetic image (machine shared with the team's builds: noisy)"
fab_setup 2 9000 tcp || exit 1
one_stream tcp
ip -n "$(fab_ns 1)" addr flush dev eth0
ip -n "$(fab_ns 2)" addr flush dev eth0
one_stream dpdk
ip netns exec "$(fab_ns 2)" build/tools/afpacket_rate rx eth0 3 >"$W/raw.out" &
rx=$!
sleep 0.3
ip netns exec "$(fab_ns 1)" build/tools/afpacket_rate tx eth0 2 9014 >/dev/null
wait $rx
echo "  raw af_packet (one sender, one receiver, 9014-byte frames): $(cat "$W/raw.out")"

echo "replication over DPDK to a chain (64 MiB, MTU 9000): time until the last node verified everything"
for n in 1 2 3; do
    FAB_TRANSPORT=dpdk FAB_MTU=9000
    fab_setup $((n + 1)) 9000 dpdk || exit 1
    rm -f "$W"/*.out
    fab_node 1 src source --key-file "$W/key" --synthetic 64M:34:2 --exit-after 1 --chunk 1048000 --timeout $T -q
    pids=($FAB_LAST)
    for ((i = 2; i <= n + 1; i++)); do
        serve=()
        [ $i -le $n ] && serve=(--exit-after 1)
        fab_node $i "n$i" joiner --key-file "$W/key" --peer "10.77.0.$((i - 1)):7000" "${serve[@]}" --chunk 1048000 --timeout $T -q
        pids+=($FAB_LAST)
    done
    for p in "${pids[@]}"; do fab_wait "$p" $T; done
    worst=$(cat "$W"/n*.out | sed -n 's/.*verified in \([0-9.]*\) s.*/\1/p' | sort -n | tail -n 1)
    echo "  $n chain node(s): ${worst:-failed} s"
done
