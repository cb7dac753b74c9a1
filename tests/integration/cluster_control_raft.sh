#!/bin/bash
# The cluster's control plane: three `strata serve --cluster` processes, one per network
# namespace (veth pairs to a bridge, 10.77.0.N), each with the tiny model, raft data on a temp
# dir, the control port 10.77.0.N:7100 and the API on 10.77.0.N:8080. Node 1 serves the model;
# nodes 2 and 3 hold it but keep it out of their engine (--cluster-standby), so the planner's
# scale-ups go to them and the stand-in executor (cluster/serve_cluster.h) carries them out.
# Scenarios, one line each:
#   - a leader is elected and /v1/cluster agrees on every node (leader, members, log);
#   - a burst on node 1 makes the leader commit a scale-up; the joiner reaches k = L; after the
#     keep-alive the leader commits a scale-down; /metrics carries the same;
#   - a node without the cluster key can neither join nor send load reports; with it, it joins;
#   - a partitioned node stops deciding and, on heal, rejoins and catches up;
#   - the leader's node is killed: a new leader within a few heartbeats, the state intact;
#   - a peer that connects to the control port and sends nothing (or half a HELLO) is closed at
#     the handshake deadline, logged and counted;
#   - the killed node, down past --cluster-remove-ms, leaves raft's configuration (4 -> 3 voters);
#     a second node dies and the two left still elect and commit: 2 of 3 voters is a quorum, 2 of
#     4 (no removal) would not be; the removed node restarts and rejoins as a voter.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
. tests/lib/serve.sh
if [ "$(id -u)" != 0 ]; then echo "skip - cluster_control: needs root for network namespaces"; exit 0; fi
[ -x "$STRATA" ] || { echo "not ok - cluster_control: $STRATA not built"; exit 1; }
command -v python3 >/dev/null || { echo "skip - cluster_control: needs python3"; exit 0; }
W=$(mktemp -d /tmp/cluster_control.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
serve_model || { echo "not ok - cluster_control: cannot convert the model"; exit 1; }
MODEL=$(realpath "$SERVE_MODEL")
HB=100
REMOVE_MS=8000   # longer than the partition of scenario 4, so that only the dead node goes
HS_MS=2000       # the handshake deadline
PEERS="1@10.77.0.1:7100,2@10.77.0.2:7100,3@10.77.0.3:7100"
fab_setup 4 || { echo "not ok - cluster_control: network namespaces"; exit 1; }
fab_key "$W/key"
fab_key "$W/other.key"
declare -A PID ARGS

start_node() { # start_node N [ARGS...]
    local n=$1
    shift
    ARGS[$n]="$*"
    fab_bg "$n" "$W/n$n" "$STRATA" serve -m "$MODEL" --host "10.77.0.$n" --port 8080 --threads 1 \
        --no-slo -v --node-id "$n" --key-file "$W/key" --raft-dir "$W/raft$n" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((15 * HB)) --keep-alive-ms 15000 \
        --cluster-remove-ms $REMOVE_MS --cluster-handshake-ms $HS_MS \
        --replicas-cached 3 --cluster "$PEERS" "$@"
    PID[$n]=$FAB_LAST
}

# cluster N: node N's /v1/cluster (empty if it does not answer)
cluster() { ip netns exec "$(fab_ns "$1")" curl -s -m 2 "http://10.77.0.$1:8080/v1/cluster"; }
metrics() { ip netns exec "$(fab_ns "$1")" curl -s -m 2 "http://10.77.0.$1:8080/metrics"; }
# q N PYEXPR: evaluate PYEXPR over node N's /v1/cluster as `d` (prints the value, "" on failure)
q() {
    cluster "$1" | python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
alive = lambda i: any(n['id'] == i and n['alive'] for n in d['nodes'])
events = lambda kind: [e for e in d['events'] if e['event'] == kind]
print($2)" 2>/dev/null
}
# until_true SECONDS N PYEXPR: poll until PYEXPR is True on node N
until_true() {
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        [ "$(q "$2" "$3")" = True ] && return 0
        sleep 0.1
    done
    return 1
}
leader_of() { q "$1" "d['leader']"; }

# Long prompts (about 400 tokens each), two at a time: the queue's predicted TTFT (the planner's
# drain of the queued prompt tokens by the step model) passes the 300 ms target.
PROMPT=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 20))
burst() {
    local i
    for i in $(seq 1 12); do
        ip netns exec "$(fab_ns 1)" curl -s -m 60 -o /dev/null http://10.77.0.1:8080/v1/completions \
            -H 'Content-Type: application/json' \
            -d '{"model":"stories260K","prompt":"'"$PROMPT"'","max_tokens":24,"temperature":0}' &
    done
    wait
}
# Node 1 first; the burst starts as soon as it serves (so it is busy, not idle for the
# keep-alive, when the others join), then the standby nodes.
start_node 1 --test-step-delay-us 100000 --max-batch 2 --ttft-ms 300
end=$((SECONDS + 60))
while [ $SECONDS -lt $end ] && ! ip netns exec "$(fab_ns 1)" curl -sf -m 2 -o /dev/null http://10.77.0.1:8080/v1/models; do
    sleep 0.2
done
burst &
BURST=$!
for n in 2 3; do start_node $n --cluster-standby --ttft-ms 300; done

# ---- 1. election and agreement
ok1=1
for n in 1 2 3; do
    until_true 60 $n "d['leader'] is not None and all(alive(i) for i in (1, 2, 3))" || ok1=0
done
L=$(leader_of 1)
sig() { q "$1" "(d['leader'], sorted((n['id'], n['alive'], n['address']) for n in d['nodes']))"; }
if [ $ok1 = 1 ] && [ -n "$L" ]; then
    # The log is replicated: wait until the three agree on leader, members and addresses.
    end=$((SECONDS + 10))
    while [ $SECONDS -lt $end ] && ! { [ "$(sig 1)" = "$(sig 2)" ] && [ "$(sig 2)" = "$(sig 3)" ]; }; do
        sleep 0.1
    done
    [ "$(sig 1)" = "$(sig 2)" ] && [ "$(sig 2)" = "$(sig 3)" ] || ok1=0
fi
if [ $ok1 = 1 ] && [ "$(q "$L" "d['raft_state']")" = leader ]; then
    ok "cluster_control: leader $L elected, /v1/cluster agrees on 3 nodes ($(sig 1))"
else
    not_ok "cluster_control: no agreed leader: $(sig 1) | $(sig 2) | $(sig 3)"
fi

# ---- 2. scale up on a burst, scale down after the keep-alive (stand-in executor)
# Node 1's API is busy with the burst: read the replicated state from node 2 (the same log).
Q=2
# The proof is in the log, not in a moment's view (the machine may be slow to poll): a SCALE_UP
# naming a standby node, then a SCALE_DONE for it, which the leader commits only once the
# joiner's committed holding reads k = L.
done_for_up="[u for u in events('scale_up') if u['node'] in (2, 3) and any(x['node'] == u['node'] and x['seq'] > u['seq'] for x in events('scale_done'))]"
if until_true 90 "$Q" "len($done_for_up) > 0"; then
    up=$(q "$Q" "$done_for_up[0]")
    joiner=$(q "$Q" "$done_for_up[0]['node']")
    upseq=$(q "$Q" "$done_for_up[0]['seq']")
    ok "cluster_control: burst on node 1: leader committed $up; standby node $joiner reached k = L (scale_done committed)"
else
    not_ok "cluster_control: no completed scale-up to a standby node during the burst: $(cluster "$Q")"
fi
wait $BURST
upseq=${upseq:-1000000}
if until_true 60 "$Q" "any(e['seq'] > $upseq for e in events('scale_down'))"; then
    down=$(q "$Q" "[e for e in events('scale_down') if e['seq'] > $upseq][0]")
    m=$(metrics "$Q" | grep -E '^strata_cluster_scale_events\{kind="(up|down)"\}' | tr '\n' ' ')
    if metrics "$Q" | grep -qE '^strata_cluster_scale_events\{kind="down"\} [1-9]' &&
        metrics "$Q" | grep -qE '^strata_cluster_scale_events\{kind="up"\} [1-9]'; then
        ok "cluster_control: idle after the burst (keep-alive 15 s): leader committed $down; /metrics: $m"
    else
        not_ok "cluster_control: /metrics lacks the scale events: $m"
    fi
else
    not_ok "cluster_control: no scale-down after the keep-alive: $(cluster "$Q")"
fi

# ---- 3. a node without the key cannot join or report; with the key it joins
refused0=$(q "$L" "d['refused_connections']")
fab_bg 4 "$W/n4bad" "$STRATA" serve -m "$MODEL" --host 10.77.0.4 --port 8080 --threads 1 -v \
    --node-id 4 --key-file "$W/other.key" --raft-dir "$W/raft4bad" --cluster-heartbeat-ms $HB \
    --cluster "$PEERS" --cluster-addr 10.77.0.4:7100
BAD=$FAB_LAST
sleep 3
refused1=$(q "$L" "d['refused_connections']")
in4=$(q "$L" "any(n['id'] == 4 for n in d['nodes'])")
kill -9 $BAD 2>/dev/null
wait $BAD 2>/dev/null
if [ "$in4" = False ] && [ -n "$refused1" ] && [ "$refused1" -gt "${refused0:-0}" ] &&
    grep -q "refused: hello: MAC does not verify" "$W/n$L.err"; then
    ok "cluster_control: node 4 with another key: refused ($((refused1 - refused0)) connections), not a member, no load report"
else
    not_ok "cluster_control: keyless node 4: in cluster=$in4 refused $refused0 -> $refused1"
fi
fab_bg 4 "$W/n4" "$STRATA" serve -m "$MODEL" --host 10.77.0.4 --port 8080 --threads 1 -v \
    --node-id 4 --key-file "$W/key" --raft-dir "$W/raft4" --cluster-heartbeat-ms $HB \
    --cluster-dead-ms $((15 * HB)) --cluster-remove-ms $REMOVE_MS --cluster-handshake-ms $HS_MS \
    --cluster-standby --cluster "$PEERS" --cluster-addr 10.77.0.4:7100
PID[4]=$FAB_LAST
if until_true 30 "$L" "alive(4)" && until_true 10 4 "alive(4) and d['leader'] == $L"; then
    ok "cluster_control: node 4 with the key joined (raft_add + assign voter) and follows leader $L"
else
    not_ok "cluster_control: node 4 with the key did not join: $(cluster "$L")"
fi

# ---- 3b. handshake deadline: one peer connects and sends nothing, another half a HELLO header
hs0=$(q "$L" "d['handshake_timeouts']")
idle=$(ip netns exec "$(fab_ns 4)" python3 - "10.77.0.$L" <<'PY'
import socket, sys, time
socks = []
for first in (b"", b"STRA\x01\x00\x00"):   # nothing; 7 of a 28-byte frame header
    s = socket.create_connection((sys.argv[1], 7100), timeout=5)
    if first:
        s.sendall(first)
    socks.append(s)
t0 = time.monotonic()
out = []
for s in socks:
    s.settimeout(30)              # a hang guard: the server is expected to close
    try:
        closed = s.recv(64) == b""
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    out.append("%s after %d ms" % ("closed" if closed else "OPEN", (time.monotonic() - t0) * 1000))
print("; ".join(out))
PY
)
hs1=$(q "$L" "d['handshake_timeouts']")
if [ "$(grep -o closed <<<"$idle" | wc -l)" = 2 ] && [ -n "$hs1" ] && [ "$hs1" -ge $((${hs0:-0} + 2)) ] &&
    grep -q "refused: no handshake within $HS_MS ms" "$W/n$L.err" &&
    metrics "$L" | grep -qE "^strata_cluster_handshake_timeouts_total $hs1\$"; then
    ok "cluster_control: idle and half-HELLO peers on node $L's control port: $idle (deadline $HS_MS ms); handshake_timeouts $hs0 -> $hs1, logged"
else
    not_ok "cluster_control: handshake deadline: peers $idle; handshake_timeouts $hs0 -> $hs1; log: $(grep -c 'no handshake' "$W/n$L.err")"
fi

# ---- 4. partition one follower: it stops deciding; on heal it rejoins and catches up
P=1
for n in 1 2 3; do [ "$n" != "$L" ] && P=$n; done
dec0=$(q "$P" "d['decisions']")
ip -n "$FAB_HUB" link set "h$P" down
if until_true 30 "$L" "not alive($P)"; then
    sleep 1
    st=$(q "$P" "(d['raft_state'], d['decisions'])")
    stale=$(q "$P" "alive($P)")
    applied_p=$(q "$P" "d['commands_applied']")
    ip -n "$FAB_HUB" link set "h$P" up
    ip -n "$FAB_HUB" link set "h$P" type bridge_slave state 3 2>/dev/null
    if [ "$(q "$P" "d['raft_state']")" != leader ] && [ "$(q "$P" "d['decisions']")" = "$dec0" ] &&
        until_true 30 "$L" "alive($P) and len(events('node_down')) > 0" &&
        until_true 30 "$P" "alive($P) and d['commands_applied'] > $applied_p and any(e['event'] == 'node_down' and e['node'] == $P for e in d['events'])"; then
        ok "cluster_control: node $P partitioned: state while cut off $st (never leader, no decisions); healed: caught up ($applied_p -> $(q "$P" "d['commands_applied']") commands), sees its own node_down"
    else
        not_ok "cluster_control: partition of node $P: while cut off $st stale=$stale; after: $(cluster "$P")"
    fi
else
    ip -n "$FAB_HUB" link set "h$P" up
    not_ok "cluster_control: the leader did not mark partitioned node $P down: $(cluster "$L")"
fi

# ---- 5. kill the leader's node
until_true 20 "$P" "d['commands_applied'] == $(q "$L" "d['commands_applied']")" >/dev/null
ev0=$(q "$P" "len(d['events'])")
t0=$(date +%s%N)
kill -9 "${PID[$L]}"
NEW=""
for ((i = 0; i < 200; i++)); do
    NEW=$(q "$P" "d['leader'] if d['leader'] not in (None, $L) and d['raft_state'] in ('leader', 'follower') else ''")
    [ -n "$NEW" ] && break
    sleep 0.05
done
t1=$(date +%s%N)
if [ -n "$NEW" ] && until_true 20 "$NEW" "not alive($L) and len(d['events']) >= $ev0 and d['raft_state'] == 'leader'"; then
    ok "cluster_control: leader $L killed: node $NEW leads after $(( (t1 - t0) / 1000000 )) ms (heartbeat $HB ms), $(q "$NEW" "len(d['events'])") events kept, node $L marked down"
else
    not_ok "cluster_control: no new leader after killing $L: $(cluster "$P")"
fi

# ---- 6. node L stays dead: removed from raft's configuration; losing a second node keeps quorum
DEAD=$L
voters() { q "$1" "sorted(d['voters'])"; }
removed="any(e['event'] == 'raft_removed' and e['node'] == $DEAD for e in d['events'])"
if [ -n "$NEW" ] && until_true $((REMOVE_MS / 1000 + 30)) "$NEW" "$DEAD not in d['voters'] and len(d['voters']) == 3 and $removed"; then
    ok "cluster_control: node $DEAD down past --cluster-remove-ms $REMOVE_MS: leader $NEW removed it from raft's configuration, voters $(voters "$NEW") (event raft_removed)"
else
    not_ok "cluster_control: node $DEAD not removed from raft's configuration: voters $(voters "${NEW:-$P}"): $(cluster "${NEW:-$P}")"
fi
# A second node of the original three dies (the leader if it is one of them). Without the removal
# 2 of 4 voters would be left, under the quorum of 3: no leader, nothing committed. With it, 2 of
# 3 voters elect a leader (if needed) and commit the second node's NODE_DOWN.
K=""
for n in 1 2 3; do [ "$n" != "$DEAD" ] && [ -z "$K" ] && K=$n; done
for n in 1 2 3; do [ "$n" = "${NEW:-0}" ] && K=$n; done
SURV=""
for n in 1 2 3 4; do [ "$n" != "$DEAD" ] && [ "$n" != "$K" ] && SURV="$SURV $n"; done
A=${SURV# }
A=${A%% *}
B=${SURV##* }
until_true 20 "$A" "d['commands_applied'] == $(q "$B" "d['commands_applied']")" >/dev/null
seq0=$(q "$A" "max([e['seq'] for e in d['events']] or [0])")
kill -9 "${PID[$K]}"
kdown="any(e['event'] == 'node_down' and e['node'] == $K and e['seq'] > ${seq0:-0} for e in d['events']) and not alive($K)"
if until_true 30 "$A" "d['leader'] in ($A, $B) and $kdown" &&
    until_true 20 "$B" "d['leader'] in ($A, $B) and $kdown"; then
    ok "cluster_control: node $K killed too: nodes$SURV (2 of voters $(voters "$A")) have leader $(q "$A" "d['leader']") and committed node $K down; 2 of 4 voters could not have"
else
    not_ok "cluster_control: after losing $DEAD (removed) and $K: $(cluster "$A") | $(cluster "$B")"
fi
# The removed node restarts from its old raft data: no leader talks to it, so it asks to join and
# the leader adds it back as a voter (raft_add + assign VOTER, event raft_voter).
LEAD=$(q "$A" "d['leader']")
start_node "$DEAD" ${ARGS[$DEAD]}
back="$DEAD in d['voters'] and alive($DEAD) and any(e['event'] == 'raft_voter' and e['node'] == $DEAD for e in d['events'])"
# Once back, it stays: one raft_removed for it (a rejoined node is not taken for dead before its
# first report commits NODE_UP).
once="len([e for e in d['events'] if e['event'] == 'raft_removed' and e['node'] == $DEAD]) == 1"
if [ -n "$LEAD" ] && until_true 60 "$LEAD" "$back" && until_true 20 "$DEAD" "d['leader'] == $LEAD and $DEAD in d['voters']" &&
    sleep 2 && [ "$(q "$LEAD" "$DEAD in d['voters'] and $once")" = True ] &&
    grep -q "asking the peers to (re)join" "$W/n$DEAD.err"; then
    ok "cluster_control: node $DEAD restarted: asked to rejoin, voter again under leader $LEAD (voters $(voters "$LEAD")), removed once"
else
    not_ok "cluster_control: removed node $DEAD did not rejoin as a voter: $(cluster "${LEAD:-$A}") | $(cluster "$DEAD")"
fi
exit $fail
