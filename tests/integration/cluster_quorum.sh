#!/bin/bash
# A cluster that lost its raft quorum, and the operator's way back (POST /v1/cluster/recover,
# `strata serve --cluster-recover`; docs/control.md). Three `strata serve --cluster` processes on
# 127.0.0.1 with the tiny model (node 1 serves it, nodes 2 and 3 hold it --cluster-standby), an
# API key on each. Scenarios, one line each:
#   - refused while the cluster has a leader (409, and the reason);
#   - nodes 2 and 3 are killed at once: node 1 has no leader and commits nothing (its commit
#     index and its view of 2 and 3, still alive, stay as they were);
#   - refusals on the stuck node: no API key (401), a list without node 1, an unknown id, a bad
#     body (400, each naming its reason); nothing changes;
#   - recovery with voters [1]: node 1 leads alone, commits 2 and 3 down, records raft_recovered;
#     /v1/cluster and /metrics count one recovery;
#   - node 2 restarts with an empty raft dir: it joins through JOIN and becomes a voter;
#   - the start-up form: all stopped, node 1 restarts with --cluster-recover 1 on its raft dir and
#     leads alone with the state it had; --cluster-recover naming another node alone, or on an
#     empty raft dir, is refused at start;
#   - two live voters named: five nodes (ids 11-15), three killed at once; {"voters":[11,14]} on
#     node 11 makes it the leader of [11, 14], node 14 (alive, its old configuration) votes for it
#     and takes the new configuration from its log, and both commit the three down.
set -u
cd "$(dirname "$0")/../.."
CL_BASE=${CL_BASE:-19300} # below cluster_replicas.sh's 19400 and the default 20000 + 10 * (pid % 1200)
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_quorum
M=$CL_MODEL
API=quorum-test-key
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" -m "$M" --api-key "$API" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((10 * HB)) --keep-alive-ms 600000 \
        --cluster-remove-ms 60000 --no-slo "$@"
}
# q N PYEXPR: PYEXPR over node N's /v1/cluster (with the key) as `d`, "" when it does not answer
q() {
    curl -s -m 2 -H "Authorization: Bearer $API" "${CL_URL[n$1]}/v1/cluster" | python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
events = lambda kind: [e for e in d['events'] if e['event'] == kind]
alive = lambda i: any(n['id'] == i and n['alive'] for n in d['nodes'])
print($2)" 2>/dev/null
}
until_true() { # until_true SECONDS N PYEXPR
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        [ "$(q "$2" "$3")" = True ] && return 0
        sleep 0.1
    done
    return 1
}
# recover N BODY [CURL ARGS...]: "STATUS SECONDS BODY" of POST /v1/cluster/recover on node N
recover() {
    local n=$1 body=$2
    shift 2
    curl -s -m 20 -o "$W/rec.out" -w '%{http_code} %{time_total}s' "$@" "${CL_URL[n$n]}/v1/cluster/recover" \
        -H 'Content-Type: application/json' -d "$body"
    echo " $(cat "$W/rec.out")"
}
KEYH=(-H "Authorization: Bearer $API")
# recover_stuck N BODY: recover, asked again while the node has not yet been without a leader
# for the 20 heartbeats a recovery waits for (409 "no leader for only"); at most 60 s
recover_stuck() {
    local end=$((SECONDS + 60)) r
    while :; do
        r=$(recover "$1" "$2" "${KEYH[@]}")
        [[ "$r" == 409*"no leader for only"* ]] && [ $SECONDS -lt $end ] || break
        sleep 0.2
    done
    echo "$r"
}

node 1 && cl_ready n1 30 && node 2 --cluster-standby && node 3 --cluster-standby ||
    { echo "not ok - cluster_quorum: nodes did not start: $(cl_why n1) $(cl_why n2) $(cl_why n3)"; exit 1; }
until_true 60 1 "d['leader'] is not None and all(alive(i) for i in (1, 2, 3)) and sorted(d['voters']) == [1, 2, 3]" ||
    { echo "not ok - cluster_quorum: no leader with 3 voters: $(q 1 d)"; exit 1; }

# ---- refused while there is a leader
R=$(recover 1 '{"voters":[1]}' "${KEYH[@]}")
case "$R" in
409*"the cluster has its quorum"*) ok "cluster_quorum: refused with a leader: ${R:0:160}" ;;
*) not_ok "cluster_quorum: recovery with a leader answered: $R" ;;
esac

# ---- quorum lost: 2 of 3 voters killed at once
cl_kill n2
cl_kill n3
until_true 20 1 "d['leader'] is None" || not_ok "cluster_quorum: node 1 still sees a leader: $(q 1 d)"
C0=$(q 1 "d['commit_index']")
sleep $((30 * HB / 1000)) # 30 heartbeats, 3 x --cluster-dead-ms: a leader would have committed 2 and 3 down
if [ "$(q 1 "d['leader'] is None and d['commit_index'] == $C0 and alive(2) and alive(3) and d['raft_state'] != 'leader' and d['last_log_index'] >= $C0")" = True ]; then
    ok "cluster_quorum: without a quorum node 1 has no leader and commits nothing (commit index $C0)"
else
    not_ok "cluster_quorum: node 1 without a quorum: $(q 1 d)"
fi

# ---- refusals on the stuck node
R1=$(recover 1 '{"voters":[1]}')
R2=$(recover 1 '{"voters":[2]}' "${KEYH[@]}")
R3=$(recover 1 '{"voters":[1,9]}' "${KEYH[@]}")
R4=$(recover 1 '{"voter":[1]}' "${KEYH[@]}")
R5=$(recover 1 '{"voters":[1,1]}' "${KEYH[@]}")
case "$R1|$R2|$R3|$R4|$R5" in
401*"API key"*"|400"*"do not name this node"*"|400"*"node 9 is not a member"*"|400"*'unknown field \"voter\"'*"|400"*"named twice"*)
    if [ "$(q 1 "d['recoveries'] == 0 and d['leader'] is None and d['commit_index'] == $C0")" = True ]; then
        ok "cluster_quorum: refusals give 401/400 with the reason, nothing changes"
    else
        not_ok "cluster_quorum: a refused request changed something: $(q 1 d)"
    fi ;;
*) not_ok "cluster_quorum: refusals: $R1 | $R2 | $R3 | $R4 | $R5" ;;
esac

# ---- recovery with voters [1]
R=$(recover_stuck 1 '{"voters":[1]}')
if [[ "$R" == 200*'"status":"recovered"'* ]] &&
    until_true 20 1 "d['leader'] == 1 and d['raft_state'] == 'leader' and d['voters'] == [1] and not alive(2) and not alive(3) and d['commit_index'] > $C0 and len(events('raft_recovered')) == 1 and d['recoveries'] == 1"; then
    MET=$(curl -s -m 2 "${KEYH[@]}" "${CL_URL[n1]}/metrics" | grep -c '^strata_cluster_recoveries_total 1$')
    if [ "$MET" = 1 ] && grep -q "recovering raft with voters 1@.*closing raft" "$W/n1.log" &&
        grep -q "raft recovered as its only voter, named 1@" "$W/n1.log"; then
        ok "cluster_quorum: recovered with voters [1] (answered in $(echo "$R" | cut -d' ' -f2)): node 1 leads, commits 2 and 3 down (commit index $C0 -> $(q 1 "d['commit_index']")), /metrics counts it"
    else
        not_ok "cluster_quorum: recovered but /metrics or the log does not say so: $(cl_why n1)"
    fi
else
    not_ok "cluster_quorum: recovery: $R | $(q 1 d) | $(cl_why n1)"
fi

# ---- a killed node comes back with an empty raft dir and joins
rm -rf "$W/raft2"
node 2 --cluster-standby || not_ok "cluster_quorum: node 2 did not restart: $(cl_why n2)"
if until_true 60 1 "sorted(d['voters']) == [1, 2] and alive(2) and d['leader'] == 1" &&
    until_true 20 2 "d['leader'] == 1 and len(events('raft_recovered')) == 1"; then
    ok "cluster_quorum: node 2 restarted empty, joined and is a voter ($(q 1 "d['voters']"))"
else
    not_ok "cluster_quorum: node 2 did not rejoin: $(q 1 d) | $(cl_why n2)"
fi

# ---- the start-up form
cl_kill n2
cl_stop n1 >/dev/null 2>&1
ST=$?
cp "$W/n1.log" "$W/n1.first.log"
if [ $ST = 0 ]; then
    ok "cluster_quorum: after its recovery node 1 stops cleanly on SIGTERM"
else
    not_ok "cluster_quorum: node 1 exited $ST on SIGTERM after its recovery: $(cl_why n1)"
fi
exited() { # exited NAME: waits (up to 120 s) for the process to end on its own; 0 if it did
    local i
    for ((i = 0; i < 1200; i++)); do
        kill -0 "${CL_PID[$1]}" 2>/dev/null || return 0
        sleep 0.1
    done
    cl_kill "$1"
    return 1
}
node 1 --cluster-recover 2
if ! exited n1 || ! grep -q "cluster-recover: the voters do not name this node" "$W/n1.log"; then
    not_ok "cluster_quorum: --cluster-recover 2 on node 1 was not refused: $(cl_why n1)"
else
    ok "cluster_quorum: --cluster-recover 2 on node 1 is refused at start ($(grep -o 'cluster-recover: the voters do not name this node ([0-9]*)' "$W/n1.log"))"
fi
node 1 --raft-dir "$W/empty" --cluster-recover 1
if ! exited n1 || ! grep -q "holds no raft log" "$W/n1.log"; then
    not_ok "cluster_quorum: --cluster-recover on an empty raft dir was not refused: $(cl_why n1)"
else
    ok "cluster_quorum: --cluster-recover on an empty raft dir is refused at start"
fi
node 1 --cluster-recover 1 && cl_ready n1 30
if until_true 30 1 "d['leader'] == 1 and d['voters'] == [1] and d['recoveries'] == 1 and len(events('raft_recovered')) == 2 and len(events('node_down')) >= 2"; then
    ok "cluster_quorum: --cluster-recover 1 at start: node 1 leads alone on the log it had ($(q 1 "len(events('node_down'))") node_down events kept)"
else
    not_ok "cluster_quorum: --cluster-recover 1: $(q 1 d) | $(cl_why n1)"
fi
cl_kill n1

# ---- two live voters named (a second cluster: ids 11-15, ports CL_BASE + 20 + i and + 30 + i)
PEERS5=""
for i in 1 2 3 4 5; do PEERS5="$PEERS5${PEERS5:+,}1$i@127.0.0.1:$((CL_BASE + 30 + i))"; done
node5() { # node5 I ARGS...: node 1I
    local i=$1
    shift
    cl_serve "n1$i" -m "$M" --api-key "$API" --node-id "1$i" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + 20 + i))" --raft-dir "$W/raft1$i" --cluster "$PEERS5" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((10 * HB)) --keep-alive-ms 600000 \
        --cluster-remove-ms 60000 --no-slo "$@"
}
node5 1 && cl_ready n11 30 && for i in 2 3 4 5; do node5 $i --cluster-standby || break; done ||
    { echo "not ok - cluster_quorum: five nodes did not start: $(cl_why n11)"; exit 1; }
ALL5="all(alive(i) for i in (11, 12, 13, 14, 15)) and sorted(d['voters']) == [11, 12, 13, 14, 15]"
# A quiet cluster: 11 and 14 hold the same log, so 14 votes for 11's recovered one (longer by the
# configuration entry).
if until_true 60 11 "d['leader'] is not None and $ALL5" && until_true 30 14 "d['leader'] is not None and $ALL5" &&
    end=$((SECONDS + 30)) && while [ $SECONDS -lt $end ] &&
        [ "$(q 11 "d['last_log_index'], d['commit_index']")" != "$(q 14 "d['last_log_index'], d['commit_index']")" ]; do sleep 0.1; done &&
    [ "$(q 11 "d['last_log_index']")" = "$(q 14 "d['last_log_index']")" ]; then
    for i in 2 3 5; do cl_kill "n1$i"; done
    until_true 20 11 "d['leader'] is None" && until_true 20 14 "d['leader'] is None"
    R=$(recover_stuck 11 '{"voters":[11,14]}')
    if [[ "$R" == 200*'"voters":[11,14]'* ]] &&
        until_true 30 11 "d['leader'] == 11 and sorted(d['voters']) == [11, 14] and not any(alive(i) for i in (12, 13, 15)) and len(events('raft_recovered')) == 1" &&
        until_true 30 14 "d['leader'] == 11 and sorted(d['voters']) == [11, 14] and not any(alive(i) for i in (12, 13, 15)) and len(events('raft_recovered')) == 1 and d['recoveries'] == 0"; then
        ok "cluster_quorum: 3 of 5 dead, {\"voters\":[11,14]} on node 11: 11 leads [11, 14], node 14 followed it without a call of its own"
    else
        not_ok "cluster_quorum: recovery with voters [11, 14]: $R | $(q 11 d) | $(q 14 d) | $(cl_why n11) | $(cl_why n14)"
    fi
else
    not_ok "cluster_quorum: five nodes did not settle: $(q 11 d) | $(q 14 d)"
fi
exit $fail
