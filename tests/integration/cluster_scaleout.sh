#!/bin/bash
# The cluster scales itself out with real weights: three `strata serve --cluster` processes on
# 127.0.0.1 (control on CL_BASE+10+N, fabric on CL_BASE+N). Node 1 holds the tiny model (-m) and
# offers it on the fabric, paced (--weight-rate) so a copy takes seconds; nodes 2 and 3 are empty
# members (no -m): they hold nothing until the planner picks them.
#   - follower_loads: a follower's /v1/cluster holds every node's load (the leader relays them:
#     every node routes requests);
#   - scale_up: a burst on node 1 makes the leader commit a scale-up to an empty node; the node
#     pulls the weights from node 1 (or from the joiner before it in the chain) into its arena and
#     reaches k = L (scale_done committed), and /v1/cluster showed it with fewer than L layers;
#   - partial_exact: a completion asked of the joiner while it held fewer than L layers is node
#     1's exact greedy text (node 1 ran the missing layers), and the joiner's /metrics count
#     tokens served while partial;
#   - scale_down: once idle for the keep-alive the leader scales replicas down and drops host
#     copies above R = 1 (a dropped node tears its engine down and says so on /health), and the
#     model stays in host memory on one node: the last copy is never dropped.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_scaleout
M=$CL_MODEL
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"

node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((15 * HB)) --keep-alive-ms 8000 \
        --replicas-cached 1 --ttft-ms 300 --no-slo "$@"
}
# q N PYEXPR: PYEXPR over node N's /v1/cluster as d ("" when it does not answer)
q() { cl_q "n$1" "$2"; } # q N PYEXPR: over node N's /v1/cluster
until_true() { cl_until "$1" "n$2" "$3"; } # until_true SECONDS N PYEXPR

P="Once upon a time"
N=16
node 1 -m "$M" --weight-rate 0.1 --test-step-delay-us 100000 --max-batch 2 &&
    cl_ready n1 30 || { echo "not ok - cluster_scaleout: node 1 did not start: $(cl_why n1)"; exit 1; }
REF=$(cl_complete n1 "$P" $N)
[ -n "$REF" ] || { echo "not ok - cluster_scaleout: no reference text: $(cl_why n1)"; exit 1; }
for n in 2 3; do
    node $n || { echo "not ok - cluster_scaleout: node $n did not start: $(cl_why n$n)"; exit 1; }
done
until_true 60 1 "d['leader'] is not None and len([n for n in d['nodes'] if n['alive']]) == 3" ||
    { echo "not ok - cluster_scaleout: no leader with 3 members: $(cl_why n1)"; exit 1; }

# ---- follower_loads: every node routes requests, so a follower holds everyone's load too (the
# leader answers each report with the others')
LEAD=$(q 1 "d['leader']")
F=1
[ "$LEAD" = 1 ] && F=2
if until_true 10 "$F" "all('load' in n for n in d['nodes']) and sum(1 for n in d['nodes'] if n['load']['relayed']) == 2"; then
    ok "follower_loads: follower $F (leader $LEAD) holds all three loads, two relayed by the leader: $(q "$F" "[(n['id'], n['load']['relayed'], n['load']['age_ms']) for n in d['nodes']]")"
else
    not_ok "follower_loads: follower $F's view: $(q "$F" "[(n['id'], n.get('load')) for n in d['nodes']]")"
fi

# Long prompts, two at a time on node 1 (100 ms steps): its predicted TTFT passes 300 ms.
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 20))
BURST=()
for i in $(seq 1 12); do
    curl -s -m 120 -o /dev/null "${CL_URL[n1]}/v1/completions" \
        -d '{"prompt":"'"$LONG"'","max_tokens":24,"temperature":0}' &
    BURST+=($!)
done

# ---- scale_up, partial_exact
J=""
end=$((SECONDS + 90))
while [ $SECONDS -lt $end ] && [ -z "$J" ]; do
    J=$(q 2 "([e['node'] for e in events('scale_up') if e['node'] in (2, 3)] or [''])[0]")
    sleep 0.1
done
asked=0 partial_seen=""
if [ -n "$J" ]; then
    for ((i = 0; i < 1200; i++)); do
        h=$(curl -s -m 2 "${CL_URL[n$J]}/health")
        st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' <<<"$h")
        k=$(sed -n 's/.*"layers_resident":\([0-9]*\).*/\1/p' <<<"$h")
        [ "$st" = partial ] && [ -z "$partial_seen" ] && partial_seen="k=$k"
        if [ "$st" = partial ] && [ $asked = 0 ]; then
            cl_complete "n$J" "$P" $N >"$W/partial.txt" &
            asked=$!
        fi
        [ "$st" = ready ] && break
        sleep 0.05
    done
fi
[ $asked != 0 ] && wait $asked
done_expr="any(x['node'] == $J for x in events('scale_done'))"
if [ -z "$J" ]; then
    not_ok "scale_up: no scale-up to an empty node: $(q 2 d) $(cl_why n1)"
elif ! until_true 60 2 "$done_expr"; then
    not_ok "scale_up: node $J never reached k = L (no scale_done): $(q 2 "hold($J)") $(cl_why n$J)"
elif ! grep -q "cluster: pulling" "$W/n$J.log"; then
    not_ok "scale_up: node $J did not pull the weights: $(cl_why n$J)"
else
    ok "scale_up: burst on node 1: leader committed $(q 2 "[e for e in events('scale_up') if e['node'] == $J][0]"); node $J pulled the model over the fabric (served while partial at $partial_seen) and reached k = L (scale_done committed)"
fi
TXT=$(cat "$W/partial.txt" 2>/dev/null)
PT=$(curl -s "${CL_URL[n$J]}/metrics" 2>/dev/null | sed -n 's/^strata_coop_partial_tokens_total \([0-9]*\).*/\1/p')
if [ $asked = 0 ]; then
    not_ok "partial_exact: node ${J:-?} was never seen serving while partial"
elif [ "$TXT" != "$REF" ]; then
    not_ok "partial_exact: the joiner's text while partial differs: '$TXT' vs '$REF'"
elif [ "${PT:-0}" -lt 1 ]; then
    not_ok "partial_exact: the joiner's /metrics count no tokens served while partial"
else
    ok "partial_exact: node $J, asked while partial ($partial_seen), answered node 1's exact text ($N tokens; $PT tokens served while partial)"
fi
wait "${BURST[@]}" 2>/dev/null

# ---- scale_down: replicas go after the keep-alive, extra host copies too, never the last one
if until_true 90 2 "len(events('scale_down')) > 0 and len(events('drop_host')) > 0 and sum(1 for n in d['nodes'] if hold(n['id']).get('host')) == 1"; then
    dropped=$(q 2 "events('drop_host')[0]['node']")
    keeper=$(q 2 "[n['id'] for n in d['nodes'] if hold(n['id']).get('host')][0]")
    h=$(curl -s -m 2 "${CL_URL[n$dropped]}/health")
    if ! grep -q '"stage":"empty' <<<"$h" && ! grep -q 'empty' <<<"$h"; then
        not_ok "scale_down: node $dropped dropped its copy but /health says $h"
    else
        ok "scale_down: idle for the keep-alive: $(q 2 "len(events('scale_down'))") scale-down(s), node $dropped dropped its host copy (/health: empty), the model stays cached on node $keeper"
    fi
else
    not_ok "scale_down: no scale-down and host-copy drop to one copy: $(q 2 "[(e['event'], e.get('node')) for e in d['events']]") $(q 2 "[(n['id'], hold(n['id'])) for n in d['nodes']]")"
fi
exit $fail
