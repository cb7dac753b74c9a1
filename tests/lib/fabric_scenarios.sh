# fabric_scenarios.sh: the multi-node scenarios shared by fabric_tcp.sh and fabric_dpdk.sh.
# Expects W (a work directory) and FAB_TRANSPORT; sets fail=1 when a scenario fails. Each scenario
# prints one "ok - NAME" or "not ok - NAME: why" line.
fail=0
fab_key "$W/key"
fab_key "$W/badkey"
T=${FAB_TIMEOUT:-40}

pass() { echo "ok - $1"; }
flunk() {
    echo "not ok - $1: $2"
    fail=1
    local f
    for f in "$W"/*.err; do [ -s "$f" ] && { echo "  --- $(basename "$f")"; tail -n 6 "$f" | sed 's/^/  /'; }; done
}

same() { # same NAME A B: byte-identical files
    cmp -s "$2" "$3" || { flunk "$1" "$(basename "$3") differs from $(basename "$2")"; return 1; }
}

# chain PREFIX N SIZE [netem args...]: source on node 1, joiners 2..N+1 each pulling from the
# previous one; every joiner must end with the source's bytes.
chain() {
    local name=$1 n=$2 size=$3
    shift 3
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup $((n + 1)) "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    local how=""
    if [ $# -gt 0 ]; then
        if fab_netem "$@" 2>/dev/null; then
            how="tc netem $*, "
        elif [ "$FAB_TRANSPORT" = dpdk ]; then
            # This kernel has no sch_netem: the nodes impair their own traffic instead (same loss,
            # reordering and delay, applied by the DPDK transport on receive).
            FAB_IMPAIR=${FAB_IMPAIR:-loss=3,reorder=10,delay=2}
            how="no sch_netem here: built-in impairment $FAB_IMPAIR, "
        else
            echo "skip - $name: this kernel has no sch_netem (kernel TCP under tc netem runs in the QEMU guest instead: fabric_rdma.sh)"
            return
        fi
    fi
    fab_node 1 src source --key-file "$W/key" --synthetic "$size:12:5" --image-out "$W/src.img" --exit-after 1 --timeout $T -q
    local pids=($FAB_LAST) i
    for ((i = 2; i <= n + 1; i++)); do
        local serve=()
        [ $i -le $n ] && serve=(--exit-after 1)
        fab_node $i "n$i" joiner --key-file "$W/key" --peer "10.77.0.$((i - 1)):7000" "${serve[@]}" --image-out "$W/n$i.img" --timeout $T -q
        pids+=($FAB_LAST)
    done
    local p bad=""
    for p in "${pids[@]}"; do fab_wait "$p" $((T + 5)) || bad="$bad $p"; done
    for ((i = 2; i <= n + 1; i++)); do
        grep -q '^complete:' "$W/n$i.out" 2>/dev/null || { flunk "$name" "node n$i: $(fab_result n$i)"; return; }
        same "$name" "$W/src.img" "$W/n$i.img" || return
    done
    [ -z "$bad" ] || { flunk "$name" "a process failed:$bad"; return; }
    pass "$name (${how}$(sed -n 's/.*verified in \([0-9.]* s\).*/\1/p' "$W/n$((n + 1)).out"))"
    FAB_IMPAIR=""
}

# Kill the source mid-stream: the joiner resumes from a second holder and ends exact.
kill_source() {
    local name=$1
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 3 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    # Paced so that the kill lands mid-stream.
    fab_node 1 s1 source --key-file "$W/key" --synthetic 24M:12:9 --image-out "$W/src.img" --rate 12 --timeout $T
    local s1=$FAB_LAST
    fab_node 2 s2 source --key-file "$W/key" --synthetic 24M:12:9 --exit-after 1 --timeout $T -q
    local s2=$FAB_LAST
    fab_node 3 j joiner --key-file "$W/key" --peer 10.77.0.1:7000 --peer 10.77.0.2:7000 --image-out "$W/j.img" --timeout $T
    local j=$FAB_LAST
    if ! fab_wait_line "$W/j.err" 'span 2/12 verified' $T; then flunk "$name" "no span arrived from the first source"; return; fi
    kill -9 "$s1"
    fab_wait "$j" $T
    fab_wait "$s2" 5
    grep -q '^complete:.* [1-9][0-9]* resumes' "$W/j.out" || { flunk "$name" "joiner: $(fab_result j)"; return; }
    grep -q 'resuming from 10.77.0.2' "$W/j.err" || { flunk "$name" "joiner did not resume from the second holder"; return; }
    same "$name" "$W/src.img" "$W/j.img" || return
    pass "$name"
}

# A joiner with another cluster key is refused and gets nothing; the source keeps serving.
wrong_key() {
    local name=$1
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 3 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    fab_node 1 src source --key-file "$W/key" --synthetic 4M:12:3 --image-out "$W/src.img" --exit-after 1 --timeout $T
    local s=$FAB_LAST
    fab_node 2 bad joiner --key-file "$W/badkey" --peer 10.77.0.1:7000 --image-out "$W/bad.img" --timeout 4
    local b=$FAB_LAST
    fab_wait "$b" 10 && { flunk "$name" "the joiner with the wrong key succeeded"; return; }
    [ -e "$W/bad.img" ] && { flunk "$name" "the joiner with the wrong key wrote an image"; return; }
    grep -q '^failed:' "$W/bad.out" || { flunk "$name" "no failure line: $(fab_result bad)"; return; }
    # The right key still works afterwards.
    fab_node 3 good joiner --key-file "$W/key" --peer 10.77.0.1:7000 --image-out "$W/good.img" --timeout $T -q
    fab_wait "$FAB_LAST" $T || { flunk "$name" "good joiner: $(fab_result good)"; return; }
    fab_wait "$s" 5
    same "$name" "$W/src.img" "$W/good.img" || return
    pass "$name ($(fab_result bad | sed "s/.*last upstream error: //" | cut -c1-120))"
}

# The source corrupts one span before sending (its chunk CRCs agree, the span CRC does not):
# the joiner detects it, re-fetches, and ends exact.
corrupt_span() {
    local name=$1
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 2 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    fab_node 1 src source --key-file "$W/key" --synthetic 8M:12:4 --image-out "$W/src.img" --exit-after 1 --corrupt-unit 4 --timeout $T -q
    local s=$FAB_LAST
    fab_node 2 j joiner --key-file "$W/key" --peer 10.77.0.1:7000 --image-out "$W/j.img" --timeout $T -q
    fab_wait "$FAB_LAST" $T
    fab_wait "$s" 5
    grep -q '^complete:.* 1 refetches' "$W/j.out" || { flunk "$name" "joiner: $(fab_result j)"; return; }
    same "$name" "$W/src.img" "$W/j.img" || return
    pass "$name"
}

run_common_scenarios() {
    local p=$1
    chain "${p}_chain_3_nodes" 2 32M
    chain "${p}_chain_4_nodes_netem_loss_reorder_delay" 3 16M loss 3% delay 2ms 1ms reorder 10% 50%
    kill_source "${p}_kill_source_resume_from_other_holder"
    kill_relay "${p}_kill_chain_predecessor_resume_from_source"
    wrong_key "${p}_wrong_cluster_key_refused"
    corrupt_span "${p}_corrupt_span_refetched"
    gguf_chain "${p}_gguf_model_chain"
}

# An on-path forger and a noisy link: the source sends a forged copy (valid CRC, bad tag) of 3% of
# its frames and corrupts 3% more after the CRC; the joiner drops them all and ends exact.
forged_packets() {
    local name=$1
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 2 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    FAB_IMPAIR="forge=3,corrupt=3" fab_node 1 src source --key-file "$W/key" --synthetic 16M:12:6 --image-out "$W/src.img" --exit-after 1 --timeout $T -q
    local s=$FAB_LAST
    fab_node 2 j joiner --key-file "$W/key" --peer 10.77.0.1:7000 --image-out "$W/j.img" --timeout $T -q
    fab_wait "$FAB_LAST" $T
    fab_wait "$s" 5
    grep -q '^complete:' "$W/j.out" || { flunk "$name" "joiner: $(fab_result j)"; return; }
    local dropped
    dropped=$(sed -n 's/.*dropped bad \([0-9]*\).*/\1/p' "$W/j.out")
    [ "${dropped:-0}" -gt 0 ] || { flunk "$name" "no forged or corrupted frame was seen"; return; }
    same "$name" "$W/src.img" "$W/j.img" || return
    pass "$name ($dropped bad frames dropped)"
}

# A real model: stories260K converted to GGUF, streamed source -> n1 -> n2. The joiners check the
# received header against the manifest (model_plan) and end with the exact header and image.
gguf_chain() {
    local name=$1 shared=${STRATA_SHARED:-../shared}
    if [ ! -f "$shared/models/stories260K.bin" ]; then
        echo "skip - $name: $shared/models/stories260K.bin is missing"
        return
    fi
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err "$W"/*.hdr
    "$STRATA" convert --tokenizer "$shared/models/tok512.bin" "$shared/models/stories260K.bin" \
        "$W/model.gguf" >/dev/null 2>&1 || { flunk "$name" "strata convert failed"; return; }
    fab_setup 3 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    fab_node 1 src source --key-file "$W/key" -m "$W/model.gguf" --chunk 16384 --image-out "$W/src.img" --header-out "$W/src.hdr" --exit-after 1 --timeout $T -q
    local s=$FAB_LAST
    fab_node 2 n1 joiner --key-file "$W/key" --peer 10.77.0.1:7000 --exit-after 1 --image-out "$W/n1.img" --header-out "$W/n1.hdr" --timeout $T
    local n1=$FAB_LAST
    fab_node 3 n2 joiner --key-file "$W/key" --peer 10.77.0.2:7000 --image-out "$W/n2.img" --header-out "$W/n2.hdr" --timeout $T
    fab_wait "$FAB_LAST" $T
    fab_wait "$n1" 5
    fab_wait "$s" 5
    local i
    for i in n1 n2; do
        grep -q '^complete:' "$W/$i.out" || { flunk "$name" "$i: $(fab_result $i)"; return; }
        same "$name" "$W/src.img" "$W/$i.img" || return
        same "$name" "$W/src.hdr" "$W/$i.hdr" || return
    done
    grep -q 'model config: dim 64, 5 layers' "$W/n2.err" || { flunk "$name" "n2 did not read the config from the header"; return; }
    pass "$name"
}

# The exception path (dpdk): the source's port also carries the kernel's traffic through a TAP
# (strata0, holding the node's address): a third node pings it and fetches a page from an HTTP
# server bound to that address (ARP, ICMP and TCP via DPDK -> TAP -> kernel and back) while a
# joiner streams the model from the same port.
exception_path() {
    local name=$1
    if [ ! -c /dev/net/tun ]; then echo "skip - $name: no /dev/net/tun for net_tap"; return; fi
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 3 1500 dpdk || { flunk "$name" "namespace setup failed"; return; }
    local ns1 ns3 i
    ns1=$(fab_ns 1)
    ns3=$(fab_ns 3)
    ip -n "$ns3" addr add 10.77.0.3/24 dev eth0
    # No --exit-after: the source (and its TAP) stays up until the checks are done.
    fab_node 1 src source --key-file "$W/key" --synthetic 16M:12:7 --image-out "$W/src.img" --rate 8 --timeout $T -q --exception-vdev net_tap0,iface=strata0
    local s=$FAB_LAST
    for i in $(seq 100); do ip -n "$ns1" link show strata0 >/dev/null 2>&1 && break; sleep 0.1; done
    ip -n "$ns1" link set strata0 address 02:00:00:00:01:01 up
    ip -n "$ns1" addr add 10.77.0.1/24 dev strata0
    mkdir -p "$W/www"
    echo "strata exception path" >"$W/www/index.html"
    ip netns exec "$ns1" python3 -m http.server 8080 --bind 10.77.0.1 --directory "$W/www" >/dev/null 2>&1 &
    FAB_PIDS+=($!)
    fab_node 2 j joiner --key-file "$W/key" --peer 10.77.0.1:7000 --image-out "$W/j.img" --timeout $T -q
    local j=$FAB_LAST ping_ok=0 http_ok=0
    # Retried like the HTTP check: on a loaded 2-core machine the source's burst loop can start
    # after the TAP is up, and a first ARP can go unanswered (seen once in CI: 0 of 3 replies).
    for i in 1 2 3 4 5; do
        if ip netns exec "$ns3" busybox ping -c 2 -W 2 10.77.0.1 >"$W/ping.log" 2>&1; then
            ping_ok=1
            break
        fi
        sleep 0.5
    done
    for i in $(seq 100); do ip netns exec "$ns1" ss -ltn 2>/dev/null | grep -q '10.77.0.1:8080' && break; sleep 0.1; done
    for i in 1 2 3 4 5; do
        if ip netns exec "$ns3" curl -s -m 5 http://10.77.0.1:8080/index.html 2>/dev/null | grep -q 'strata exception path'; then
            http_ok=1
            break
        fi
        sleep 0.5
    done
    fab_wait "$j" $T
    kill "$s" 2>/dev/null
    fab_wait "$s" 5
    [ $ping_ok = 1 ] || { flunk "$name" "ping through the TAP failed: $(tail -n 2 "$W/ping.log" | tr '\n' ' ')"; return; }
    [ $http_ok = 1 ] || { flunk "$name" "HTTP through the TAP failed"; return; }
    grep -q '^complete:' "$W/j.out" || { flunk "$name" "joiner: $(fab_result j)"; return; }
    same "$name" "$W/src.img" "$W/j.img" || return
    pass "$name"
}

# Kill a chain predecessor mid-stream: source -> n1 -> n2, n1 dies; n2 resumes from the source
# (its second peer) and ends exact.
kill_relay() {
    local name=$1
    rm -f "$W"/*.img "$W"/*.out "$W"/*.err
    fab_setup 3 "${FAB_MTU:-1500}" "$FAB_TRANSPORT" || { flunk "$name" "namespace setup failed"; return; }
    fab_node 1 src source --key-file "$W/key" --synthetic 24M:12:11 --image-out "$W/src.img" --timeout $T -q
    local s=$FAB_LAST
    fab_node 2 n1 joiner --key-file "$W/key" --peer 10.77.0.1:7000 --rate 12 --exit-after 1 --timeout $T
    local n1=$FAB_LAST
    fab_node 3 n2 joiner --key-file "$W/key" --peer 10.77.0.2:7000 --peer 10.77.0.1:7000 --image-out "$W/n2.img" --timeout $T
    local n2=$FAB_LAST
    if ! fab_wait_line "$W/n2.err" 'span 2/12 verified' $T; then flunk "$name" "no span arrived through n1"; return; fi
    kill -9 "$n1"
    fab_wait "$n2" $T
    kill "$s" 2>/dev/null
    fab_wait "$s" 5
    grep -q '^complete:.* [1-9][0-9]* resumes' "$W/n2.out" || { flunk "$name" "n2: $(fab_result n2)"; return; }
    grep -q 'resuming from 10.77.0.1' "$W/n2.err" || { flunk "$name" "n2 did not resume from the source"; return; }
    same "$name" "$W/src.img" "$W/n2.img" || return
    pass "$name"
}
