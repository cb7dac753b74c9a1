#!/bin/bash
# R host copies and model switches with real processes: five `strata serve --cluster` processes on
# 127.0.0.1 with --replicas-cached 2 (R = 2) and one model slot each (the serving process holds
# one model). Node 1 serves model "a" (stories260K), node 2 model "b" (the synthetic grouped-query
# model of cluster_models.sh); nodes 3, 4 and 5, started first, are empty members. Every node
# steps slowly (--test-step-delay-us) so a steady stream of requests makes a model late. Racks
# (--rack): nodes 1 and 3 are in rack r1, nodes 2, 4 and 5 in rack r2.
#   - replicate: the leader copies each model into the host memory of an empty node (a and b on
#     nodes 3 and 4, one each: never onto the node serving the other model), each in the other
#     rack than its source (a from node 1 onto node 4, b from node 2 onto node 3; by id alone a
#     would go to node 3, beside its source, and b to node 4), the copies complete (scale_done),
#     and each copy, asked directly (X-Strata-Route: local: served by that node's own arena),
#     answers its source's exact greedy text; /v1/cluster and /metrics show each node's rack;
#   - restore: the holder of a's copy is SIGKILLed; the leader commits it down and restores R = 2
#     from the survivor (node 1, rack r1) onto node 5 (rack r2, the only free node), whose copy
#     answers a's exact text: a's copies are in both racks again;
#   - switch: once a has idled out of every engine (nodes 1 and 5 hold it in host memory only), a
#     steady stream of b requests: b scales up on the node caching b, and then, with no free node
#     left, on one of the nodes caching a: it drops a (a stays cached on the other) and pulls b,
#     answering b's exact text; the other, now a's last host copy, is never switched though b
#     stays late;
#   - r_after_switch: once the stream stops and the b replicas idle out (keep-alive), an extra
#     copy of b is dropped and R of a is restored into the freed node;
#   - keep_alive: every scale-down comes at least the keep-alive after that node's scale-up (a
#     replica brought back from its host copy is not scaled down on the next tick).
set -u
cd "$(dirname "$0")/../.."
CL_BASE=${CL_BASE:-19400} # below every other cluster script's range (20000 + 10 * (pid % 1200))
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_replicas
A=$CL_MODEL
B=$W/gqa.gguf
build/tools/synth_model --shape tiny-gqa --type f32 --seed 7 -o "$B" \
    --tokenizer "$SHARED/models/tok512.bin" >/dev/null 2>&1 ||
    { echo "not ok - cluster_replicas: cannot make the second model"; exit 1; }
HB=100
PEERS=""
for n in 1 2 3 4 5; do PEERS="$PEERS${PEERS:+,}$n@127.0.0.1:$((CL_BASE + 10 + n))"; done
rack() { case $1 in 1 | 3) echo r1 ;; *) echo r2 ;; esac; }
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --rack "$(rack "$n")" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((15 * HB)) --keep-alive-ms 5000 \
        --replicas-cached 2 --ttft-ms 60 --no-slo --test-step-delay-us 50000 --max-batch 1 "$@"
}
q() { cl_q_any "$1"; }                 # q PYEXPR: over the first live node that answers
until_true() { cl_until_any "$1" "$2"; } # until_true SECONDS PYEXPR
ask() { # ask NODE MODEL PROMPT N [CURL ARGS]: the greedy text
    local n=$1 m=$2 p=$3 k=$4
    shift 4
    curl -s -m 120 "$@" "${CL_URL[n$n]}/v1/completions" \
        -d "{\"model\":\"$m\",\"prompt\":\"$p\",\"max_tokens\":$k,\"temperature\":0}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}
own() { ask "$@" -H 'X-Strata-Route: local'; } # served by that node itself, never relayed
holders() { q "sorted(n['id'] for n in d['nodes'] if n['alive'] and hold(n['id'], '$1').get('host'))"; }
why() { echo "events $(q "[(e['seq'], e['event'], e['node'], e.get('model'), e.get('source')) for e in d['events']]") holdings $(q "[(n['id'], n['alive'], [(x['name'], x.get('host'), x.get('engine')) for x in n['models']]) for n in d['nodes']]")"; }

# keep_alive: appends "SEQ NODE MODEL MS" to $W/ka_all for each scale-down in the event window
# (32 events) that follows a scale-up of the same node and model, MS after it (checked at the end)
keep_alive() {
    q "'\\n'.join(f\"{e['seq']} {e['node']} {e['model']} {e['t_ms'] - u['t_ms']}\" for e in events('scale_down') for u in [max((u for u in events('scale_up', e['model']) if u['node'] == e['node'] and u['seq'] < e['seq']), key=lambda u: u['seq'], default=None)] if u)" >>"$W/ka_all"
}
P="Once upon a time"
# The empty members first (three of the five voters: they elect a leader), all three committed
# members before a model holder joins: each copy is placed with every free node to choose from.
node 3 && node 4 && node 5 && cl_until 30 n3 "d['leader'] is not None and sorted(n['id'] for n in d['nodes'] if n['alive']) == [3, 4, 5]" ||
    { echo "not ok - cluster_replicas: nodes 3, 4, 5 did not form a cluster: $(cl_why n3) $(cl_why n4) $(cl_why n5)"; exit 1; }
node 1 -m "$A" --name a && cl_ready n1 30 && node 2 -m "$B" --name b && cl_ready n2 30 ||
    { echo "not ok - cluster_replicas: nodes 1, 2 did not start: $(cl_why n1) $(cl_why n2)"; exit 1; }
REF_A=$(own 1 a "$P" 12)
REF_B=$(own 2 b "$P" 8)
[ -n "$REF_A" ] && [ -n "$REF_B" ] && [ "$REF_A" != "$REF_B" ] ||
    { echo "not ok - cluster_replicas: no reference texts ('$REF_A', '$REF_B'): $(cl_why n1) $(cl_why n2)"; exit 1; }

# ---- replicate
if until_true 60 "d['leader'] is not None and all(any(e['model'] == m and e['node'] in (3, 4) for e in events('scale_done')) for m in 'ab')"; then
    RA=$(q "[e['node'] for e in events('replicate_host', 'a')][0]")
    RB=$(q "[e['node'] for e in events('replicate_host', 'b')][0]")
    srcs=$(q "sorted((e['model'], e['source']) for e in events('replicate_host'))")
    TA=$(own "$RA" a "$P" 12)
    TB=$(own "$RB" b "$P" 8)
    racks=$(q "sorted((n['id'], n['rack']) for n in d['nodes'])")
    if [ "$(q "len(events('replicate_host'))")" != 2 ] || [ "$srcs" != "[('a', 1), ('b', 2)]" ] ||
        [ "$RA" = "$RB" ]; then
        not_ok "replicate: not one copy of each model from its holder onto nodes 3 and 4: $(why)"
    elif [ "$racks" != "[(1, 'r1'), (2, 'r2'), (3, 'r1'), (4, 'r2'), (5, 'r2')]" ] ||
        ! curl -s "${CL_URL[n1]}/metrics" | grep -q '^strata_cluster_node_alive{node="4",rack="r2"} 1$'; then
        not_ok "replicate: racks in /v1/cluster $racks, /metrics: $(curl -s "${CL_URL[n1]}/metrics" | grep '^strata_cluster_node_alive' | tr '\n' ' ')"
    elif [ "$RA" != 4 ] || [ "$RB" != 3 ]; then
        not_ok "replicate: a's copy on node $RA, b's on node $RB: not each in the rack without a copy (a on 4, b on 3): $(why)"
    elif [ "$(q "hold($RA, 'a').get('host') and not hold($RA, 'a').get('engine') and hold($RB, 'b').get('host') and not hold($RB, 'b').get('engine')")" != True ]; then
        not_ok "replicate: the copies are not host copies out of the engine: $(why)"
    elif [ "$(holders a)" != "[1, $RA]" ] || [ "$(holders b)" != "[2, $RB]" ]; then
        not_ok "replicate: holders of a $(holders a), of b $(holders b): $(why)"
    elif [ "$TA" != "$REF_A" ] || [ "$TB" != "$REF_B" ]; then
        not_ok "replicate: the copies' own texts differ: '$TA' vs '$REF_A', '$TB' vs '$REF_B'"
    else
        ok "replicate: R = 2: a copied from node 1 (rack r1) into node $RA's host memory (rack r2), b from node 2 (r2) into node $RB's (r1) (scale_done), each on an empty node in the rack without a copy; each copy, asked directly, answers its source's exact greedy text; racks in /v1/cluster and /metrics"
    fi
else
    echo "not ok - cluster_replicas: replicate: the two copies never completed: $(why)"
    exit 1
fi

keep_alive
# ---- restore: the holder of a's copy dies; R comes back from the survivor onto node 5
until_true 30 "len([n for n in d['nodes'] if n['alive']]) == 5" ||
    not_ok "restore: node 5 is not a live member: $(why)"
BEFORE=$(q "d['events'][-1]['seq']")
cl_kill "n$RA"
unset "CL_PID[n$RA]"
if until_true 60 "any(e['seq'] > $BEFORE and e['model'] == 'a' for e in events('scale_done')) and any(e['seq'] > $BEFORE and e['node'] == $RA for e in events('node_down'))"; then
    got=$(q "[(e['node'], e['source']) for e in events('replicate_host', 'a') if e['seq'] > $BEFORE]")
    T5=$(own 5 a "$P" 12)
    if [ "$got" != "[(5, 1)]" ]; then
        not_ok "restore: a's copy was restored as $got, not onto node 5 from node 1: $(why)"
    elif [ "$(holders a)" != "[1, 5]" ] || [ "$(holders b)" != "[2, $RB]" ]; then
        not_ok "restore: holders of a $(holders a), of b $(holders b): $(why)"
    elif [ "$(q "sorted(n['rack'] for n in d['nodes'] if n['alive'] and hold(n['id'], 'a').get('host'))")" != "['r1', 'r2']" ]; then
        not_ok "restore: a's copies are not in racks r1 and r2: $(why)"
    elif [ "$T5" != "$REF_A" ]; then
        not_ok "restore: node 5's copy answers '$T5', not '$REF_A'"
    else
        ok "restore: node $RA (a's copy, rack $(rack "$RA")) SIGKILLed: node_down committed and R = 2 restored from node 1 (r1) onto node 5 (the free node, r2), whose copy answers a's exact text: a is in both racks again"
    fi
else
    not_ok "restore: no completed copy of a after node $RA died: $(why)"
fi

keep_alive
# ---- switch: a steady stream of b (three a second, each 33 steps of 50 ms, one at a time per
# node: more than three replicas can take). First a idles out of every engine (keep-alive), so
# nodes 1 and 5 both hold a in host memory only: both could switch, but only one may.
until_true 30 "not any(hold(n['id'], 'a').get('engine') for n in d['nodes'] if n['alive']) and sorted(n['id'] for n in d['nodes'] if n['alive'] and hold(n['id'], 'a').get('host')) == [1, 5]" ||
    not_ok "switch: a did not go to zero engine replicas on nodes 1 and 5: $(why)"
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 8)) # b: ctx 256
BEFORE=$(q "d['events'][-1]['seq']")
(
    for i in $(seq 1 150); do
        [ -e "$W/stop" ] && break
        curl -s -m 120 -o "$W/b$i.json" "${CL_URL[n2]}/v1/completions" \
            -d '{"model":"b","prompt":"'"$LONG"'","max_tokens":32,"temperature":0}' &
        sleep 0.33
    done
    wait
) &
STREAM=$!
SW="any(e['seq'] > $BEFORE and e['node'] in (1, 5) and e['model'] == 'b' for e in events('scale_done'))"
# the holdings are checked as they were when node S's b came up (a kept answer: by the time the
# checks run, the stream may have ended and b's extra copy idled out, which r_after_switch checks)
SNAP=$W/switched.json
sq() { cl_eval "$1" <"$SNAP"; }
swhy() { echo "at the switch: events $(sq "[(e['seq'], e['event'], e['node'], e.get('model'), e.get('source')) for e in d['events']]") holdings $(sq "[(n['id'], n['alive'], [(x['name'], x.get('host'), x.get('engine')) for x in n['models']]) for n in d['nodes']]")"; }
if cl_until_snap 90 "$SW" "$SNAP"; then
    # the stream goes on a while: b stays late, and the node with a's last copy must not switch
    waiting=0
    for i in $(seq 1 20); do
        w=$(q "sum(n['load']['queue'] for n in d['nodes'] if n['alive'] and 'load' in n and hold(n['id'], 'b').get('engine'))")
        [ "${w:-0}" -gt $waiting ] && waiting=$w
        sleep 0.2
    done
    touch "$W/stop"
    S=$(sq "[e['node'] for e in events('scale_up', 'b') if e['seq'] > $BEFORE and e['node'] in (1, 5)][0]")
    X=$((6 - S)) # the other holder of a
    SEQ=$(sq "[e['seq'] for e in events('scale_up', 'b') if e['node'] == $S][-1]")
    TS=$(own "$S" b "$P" 8)
    if ! grep -q "a dropped from this node: switching to b" "$W/n$S.log"; then
        not_ok "switch: node $S took b without dropping a: $(cl_why "n$S")"
    elif [ "$(sq "hold($S, 'b').get('engine') and not hold($S, 'a').get('host')")" != True ]; then
        not_ok "switch: node $S's holdings: $(swhy)"
    elif [ "$(sq "sorted(n['id'] for n in d['nodes'] if n['alive'] and hold(n['id'], 'a').get('host'))")" != "[$X]" ] ||
        [ "$(sq "bool(hold($X, 'a').get('engine'))")" != False ]; then
        not_ok "switch: a is not cached on node $X alone, out of its engine: $(swhy)"
    # while X is a's last copy: until b's extra copy is dropped after the stream (r_after_switch
    # restores a's R then, and X may take b legitimately while the stream's queue drains)
    elif [ "$(q "any(e['node'] == $X and e['seq'] < min([x['seq'] for x in events('drop_host', 'b') if x['seq'] > $SEQ], default=1 << 60) for e in events('scale_up', 'b'))")" != False ]; then
        not_ok "switch: node $X, a's last host copy, was switched too: $(why)"
    elif [ "$TS" != "$REF_B" ]; then
        not_ok "switch: node $S answers b with '$TS', not '$REF_B'"
    else
        ok "switch: a stream of b scaled b up on $(q "[e['node'] for e in events('scale_up', 'b') if e['seq'] > $BEFORE]"); node $S, holding a in host memory only, dropped a (still cached on node $X) and pulled b, answering b's exact text; node $X, host-only too but a's last host copy, was not switched while the stream went on (up to $waiting b requests waiting)"
    fi
else
    touch "$W/stop"
    not_ok "switch: no node holding a switched to b: $(why) $(cl_why n2)"
    SEQ=""
fi
wait "$STREAM" 2>/dev/null
bad=0
for f in "$W"/b*.json; do grep -q '"text"' "$f" || bad=$((bad + 1)); done
[ $bad = 0 ] || not_ok "switch: $bad of the stream's b requests got no completion: $(head -c 300 "$(ls "$W"/b*.json | head -n1)")"

keep_alive
# ---- r_after_switch: a is down to one copy and no node is free; once b's extra copies idle
# out, one is dropped and a's R is restored into that node
if [ -n "$SEQ" ]; then
    if until_true 90 "any(e['seq'] > $SEQ and e['model'] == 'a' for e in events('scale_done')) and len([1 for n in d['nodes'] if n['alive'] and hold(n['id'], 'a').get('host')]) == 2"; then
        D=$(q "[e['node'] for e in events('drop_host', 'b') if e['seq'] > $SEQ][0]")
        got=$(q "[(e['node'], e['source']) for e in events('replicate_host', 'a') if e['seq'] > $SEQ][0]")
        if [ "$got" != "($D, $X)" ]; then
            not_ok "r_after_switch: a restored as $got, b's copy dropped on node $D: $(why)"
        elif [ "$(holders b)" = "[]" ] || [ "$(holders a)" != "$(python3 -c "print(sorted([$D, $X]))")" ]; then
            not_ok "r_after_switch: holders of a $(holders a), of b $(holders b): $(why)"
        else
            ok "r_after_switch: b's replicas idled out, node $D dropped its extra copy of b, and a's R = 2 was restored from node $X into it (a on $(holders a), b on $(holders b); racks of a $(q "sorted(n['rack'] for n in d['nodes'] if n['alive'] and hold(n['id'], 'a').get('host'))"), of b $(q "sorted(n['rack'] for n in d['nodes'] if n['alive'] and hold(n['id'], 'b').get('host'))"))"
        fi
    else
        not_ok "r_after_switch: a's second copy never came back: $(why)"
    fi
fi
keep_alive

# ---- keep_alive: an engine replica brought back from its host copy starts its keep-alive then,
# not when the copy went idle (else it is scaled down on the tick after it came up)
sort -u "$W/ka_all" | sed '/^$/d' >"$W/ka"
early=$(awk '$4 < 5000' "$W/ka" | tr '\n' ';')
if [ ! -s "$W/ka" ]; then
    not_ok "keep_alive: no scale-down after a scale-up to check: $(why)"
elif [ -n "$early" ]; then
    not_ok "keep_alive: scaled down sooner than the keep-alive after the scale-up (seq node model ms): $early"
else
    ok "keep_alive: $(wc -l <"$W/ka") scale-downs, each 5 s (the keep-alive) or more after that node's scale-up: $(awk '{printf "%s on %s %.1f s; ", $3, $2, $4 / 1000}' "$W/ka")"
fi
exit $fail
