#!/bin/bash
# Two models in one cluster, each scaled on its own: three `strata serve --cluster` processes on
# 127.0.0.1. Node 1 serves the tiny model (stories260K); node 2 serves a second model, a
# synthetic grouped-query one ("gqa", tests/tools/synth_model, the same 512-token vocabulary),
# paced so a copy takes seconds and with slow steps; node 3 is an empty member.
#   - by_name: a completion naming "gqa" sent to node 1 is relayed to node 2 (the route is per
#     model) and equals node 2's own answer; one naming stories260K sent to node 2 is node 1's;
#   - each_scaled: a burst of "gqa" requests makes the leader scale "gqa" out to node 3, which
#     pulls it from node 2 and answers node 2's exact text; stories260K is not scaled up;
#   - scale_to_zero: stories260K, idle for the keep-alive, goes to zero engine replicas while
#     node 1 keeps it in host memory; a request for it is then answered (node 1 serves it and the
#     leader brings the cached copy back into the engine: a scale-up from host memory).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_models
A=$CL_MODEL
B=$W/gqa.gguf
build/tools/synth_model --shape tiny-gqa --type f32 --seed 7 -o "$B" \
    --tokenizer "$SHARED/models/tok512.bin" >/dev/null 2>&1 ||
    { echo "not ok - cluster_models: cannot make the second model"; exit 1; }
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
q() { cl_q "n$1" "$2"; } # q N PYEXPR: over node N's /v1/cluster
until_true() { cl_until "$1" "n$2" "$3"; } # until_true SECONDS N PYEXPR
ask() { # ask NODE MODEL PROMPT N: the greedy text
    curl -s -m 120 "${CL_URL[n$1]}/v1/completions" \
        -d "{\"model\":\"$2\",\"prompt\":\"$3\",\"max_tokens\":$4,\"temperature\":0}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}

P="Once upon a time"
node 1 -m "$A" --weight-rate 0.2 --test-step-delay-us 30000 && cl_ready n1 30 &&
    node 2 -m "$B" --name gqa --weight-rate 1 --test-step-delay-us 100000 --max-batch 2 &&
    cl_ready n2 30 || { echo "not ok - cluster_models: nodes 1, 2 did not start: $(cl_why n1) $(cl_why n2)"; exit 1; }
REF_A=$(ask 1 stories260K "$P" 16)
REF_B=$(ask 2 gqa "$P" 8)
node 3 || { echo "not ok - cluster_models: node 3 did not start: $(cl_why n3)"; exit 1; }
until_true 60 1 "d['leader'] is not None and len([n for n in d['nodes'] if n['alive']]) == 3 and hold(2, 'gqa').get('host') and hold(1, 'stories260K').get('host')" ||
    { echo "not ok - cluster_models: no leader with both models: $(q 1 d)"; exit 1; }

# ---- by_name
B_AT_1=$(ask 1 gqa "$P" 8)
A_AT_2=$(ask 2 stories260K "$P" 16)
if [ -z "$REF_A" ] || [ -z "$REF_B" ]; then
    not_ok "by_name: no reference texts: $(cl_why n1) $(cl_why n2)"
elif [ "$B_AT_1" != "$REF_B" ] || [ "$A_AT_2" != "$REF_A" ]; then
    not_ok "by_name: '$B_AT_1' vs '$REF_B', '$A_AT_2' vs '$REF_A'"
elif ! grep -q "forwarded to node 2" "$W/n1.log" || ! grep -q "forwarded to node 1" "$W/n2.log"; then
    not_ok "by_name: the requests were not relayed by model: $(grep route "$W/n1.log" | tail -n 2)"
else
    ok "by_name: gqa asked of node 1 was relayed to node 2, stories260K asked of node 2 to node 1; both texts exact"
fi

# ---- each_scaled
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 8)) # gqa: ctx 256
BURST=()
for i in $(seq 1 12); do
    curl -s -m 120 -o "$W/burst$i.json" "${CL_URL[n2]}/v1/completions" \
        -d '{"model":"gqa","prompt":"'"$LONG"'","max_tokens":16,"temperature":0}' &
    BURST+=($!)
done
if until_true 90 1 "any(e['node'] == 3 for e in events('scale_up', 'gqa')) and any(e['node'] == 3 for e in events('scale_done', 'gqa'))"; then
    B_AT_3=$(ask 3 gqa "$P" 8)
    up_a=$(q 1 "len(events('scale_up', 'stories260K'))")
    if [ "$B_AT_3" != "$REF_B" ]; then
        not_ok "each_scaled: node 3's gqa text differs: '$B_AT_3' vs '$REF_B'"
    elif [ "$up_a" != 0 ]; then
        not_ok "each_scaled: stories260K was scaled up too ($up_a) though only gqa was loaded"
    elif ! grep -q "cluster: pulling gqa" "$W/n3.log"; then
        not_ok "each_scaled: node 3 did not pull gqa: $(cl_why n3)"
    else
        ok "each_scaled: a gqa burst scaled gqa out to node 3 (pulled from node 2, k = L, exact text); stories260K untouched"
    fi
else
    L=$(q 1 "d['leader']")
    not_ok "each_scaled: no completed gqa scale-out to node 3: $(q 1 "d['events']") leader $L: $(q "$L" "[(n['id'], n['models'], n.get('load')) for n in d['nodes']]") first answer: $(head -c 300 "$W/burst1.json")"
fi
wait "${BURST[@]}" 2>/dev/null

# ---- scale_to_zero: stories260K has been idle since the start
if until_true 60 1 "any(e['node'] == 1 for e in events('scale_down', 'stories260K')) and hold(1, 'stories260K').get('host') and not any(n.get('engine') for n in [hold(i, 'stories260K') for i in (1, 2, 3)])"; then
    down=$(q 1 "events('scale_down', 'stories260K')[-1]['seq']")
    TXT=$(ask 1 stories260K "$P" 16)
    if [ "$TXT" != "$REF_A" ]; then
        not_ok "scale_to_zero: after zero replicas the answer differs: '$TXT' vs '$REF_A'"
    elif ! until_true 30 1 "any(e['seq'] > $down and e['node'] == 1 for e in events('scale_up', 'stories260K'))"; then
        not_ok "scale_to_zero: the request did not bring stories260K back: $(q 1 "d['events']")"
    else
        ok "scale_to_zero: idle stories260K went to zero engine replicas, still in node 1's host memory; a request was answered exactly and the leader scaled it back up from the cached copy"
    fi
else
    not_ok "scale_to_zero: stories260K never reached zero engine replicas while cached: $(q 1 "[(n['id'], n['models']) for n in d['nodes']]")"
fi
exit $fail
