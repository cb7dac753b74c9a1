#!/bin/bash
# Refusals and held requests with real processes: four `strata serve --cluster` processes on
# 127.0.0.1 with --replicas-cached 2 (R = 2). Node 1 serves model "a" (stories260K); nodes 2, 3
# and 4, started first, are empty members; node 2 runs --test-refuse replicate (its executor
# refuses every replication, as a node whose one slot was taken after the decision would).
# --scaleout-timeout-ms stays 10 minutes: only the refusal can end the decision sooner.
#   - refused: the leader's first copy of a goes to node 2 (the lowest id of the free nodes);
#     node 2 refuses it and says so in its next load report; the leader abandons the scale-out
#     (scale_abandoned naming node 2 and the executor's reason, in /v1/cluster's events) and
#     places the copy on node 3 instead, which completes (scale_done) and answers a's exact
#     greedy text; node 2 is never asked again;
#   - held: once a idles out of node 1's engine (scale_down: no replica of a anywhere), a
#     request to node 4, which has no copy of a, waits in its relay for a replica: it
#     is counted as held, the leader scales a up (a cold start), and the held request is answered
#     with a's exact greedy text.
set -u
cd "$(dirname "$0")/../.."
CL_BASE=${CL_BASE:-19200} # below every other cluster script's range (20000 + 10 * (pid % 1200))
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_refusals
A=$CL_MODEL
HB=100
PEERS=""
for n in 1 2 3 4; do PEERS="$PEERS${PEERS:+,}$n@127.0.0.1:$((CL_BASE + 10 + n))"; done
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((15 * HB)) --keep-alive-ms 3000 \
        --scaleout-timeout-ms 600000 --replicas-cached 2 --ttft-ms 60 --no-slo \
        --test-step-delay-us 50000 --max-batch 1 "$@"
}
q() { cl_q_any "$1"; }                 # q PYEXPR: over the first live node that answers
until_true() { cl_until_any "$1" "$2"; } # until_true SECONDS PYEXPR
ask() { # ask NODE PROMPT N [CURL ARGS]: the greedy text
    local n=$1 p=$2 k=$3
    shift 3
    curl -s -m 120 "$@" "${CL_URL[n$n]}/v1/completions" \
        -d "{\"model\":\"a\",\"prompt\":\"$p\",\"max_tokens\":$k,\"temperature\":0}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}
own() { ask "$@" -H 'X-Strata-Route: local'; } # served by that node itself, never relayed
why() { echo "events $(q "[(e['seq'], e['event'], e['node'], e.get('model'), e.get('source'), e.get('reason')) for e in d['events']]") holdings $(q "[(n['id'], n['alive'], [(x['name'], x.get('host'), x.get('engine')) for x in n['models']]) for n in d['nodes']]")"; }
P="Once upon a time"

node 2 --test-refuse replicate && node 3 && node 4 &&
    cl_until 30 n3 "d['leader'] is not None and sorted(n['id'] for n in d['nodes'] if n['alive']) == [2, 3, 4]" ||
    { echo "not ok - cluster_refusals: nodes 2, 3, 4 did not form a cluster: $(cl_why n2) $(cl_why n3) $(cl_why n4)"; exit 1; }
node 1 -m "$A" --name a && cl_ready n1 30 ||
    { echo "not ok - cluster_refusals: node 1 did not start: $(cl_why n1)"; exit 1; }
REF=$(own 1 "$P" 12)
[ -n "$REF" ] || { echo "not ok - cluster_refusals: no reference text: $(cl_why n1)"; exit 1; }

# ---- refused
if until_true 60 "any(e['node'] == 3 for e in events('scale_done', 'a'))"; then
    first=$(q "[(e['node'], e['source']) for e in events('replicate_host', 'a')]")
    ab=$(q "[(e['node'], e.get('reason', '')) for e in events('scale_abandoned', 'a')]")
    # the refusal's seq and time against the decision's
    lat=$(q "[a['t_ms'] - r['t_ms'] for r in events('replicate_host', 'a') if r['node'] == 2 for a in events('scale_abandoned', 'a') if a['node'] == 2 and a['seq'] > r['seq']][0]")
    T3=$(own 3 "$P" 12)
    if [ "$first" != "[(2, 1), (3, 1)]" ]; then
        not_ok "refused: copies of a decided as $first, not node 2 then node 3 from node 1: $(why)"
    elif ! python3 -c "import sys; l = $ab; sys.exit(not (len(l) == 1 and l[0][0] == 2 and '--test-refuse replicate' in l[0][1]))"; then
        not_ok "refused: the abandon does not name node 2 and its reason: $ab: $(why)"
    elif ! grep -q "refused decision [0-9]* (replication of a from node 1): --test-refuse replicate" "$W/n2.log"; then
        not_ok "refused: node 2 did not log its refusal: $(cl_why n2)"
    elif [ "$(q "bool(hold(3, 'a').get('host')) and not hold(2, 'a').get('host')")" != True ]; then
        not_ok "refused: holdings: $(why)"
    elif [ "$T3" != "$REF" ]; then
        not_ok "refused: node 3's copy answers '$T3', not '$REF'"
    else
        ok "refused: node 2 refused the copy of a ($ab); the leader abandoned it $lat ms after deciding it (about $(((lat + HB / 2) / HB)) heartbeat(s) of $HB ms; --scaleout-timeout-ms is 600000) and copied a onto node 3 instead (decisions $first), whose copy answers a's exact greedy text"
    fi
else
    echo "not ok - cluster_refusals: refused: a's copy never completed elsewhere: $(why) $(cl_why n2)"
    exit 1
fi

# ---- held: a request to node 4 (no copy of a) waits in its relay: held, and a scales up (a
# cold start); the held request is then answered by the new replica with a's exact text
until_true 30 "any(e['node'] == 1 for e in events('scale_down', 'a')) and not any(hold(n['id'], 'a').get('engine') for n in d['nodes'] if n['alive'])" ||
    not_ok "held: a did not idle out of node 1's engine: $(why)"
BEFORE=$(q "d['events'][-1]['seq']")
T=$(ask 4 "$P" 12)
if until_true 30 "any(e['seq'] > $BEFORE for e in events('scale_up', 'a'))" && [ "$T" = "$REF" ]; then
    ok "held: a request to node 4 (no copy of a) was held for lack of a replica and counted: the leader scaled a up on node(s) $(q "[e['node'] for e in events('scale_up', 'a') if e['seq'] > $BEFORE]"), and the held request got a's exact greedy text"
else
    not_ok "held: no scale-up of a, or not a's text ('$T' vs '$REF'), after a request held on node 4: $(why) $(cl_why n4)"
fi
exit $fail
