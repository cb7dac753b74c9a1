#!/bin/bash
# The source of a cluster scale-out dies mid-stream: three `strata serve --cluster` processes on
# 127.0.0.1. Nodes 1 and 2 serve the tiny model (-m) and offer it on the fabric, paced so a copy
# takes seconds; node 3 is an empty member. A burst on nodes 1 and 2 makes the leader scale out to
# node 3 from node 1 (the first holder); once node 3 has some layers, node 1 (the source, and the
# leader) is SIGKILLed.
#   - source_killed: node 3 resumes the stream from node 2, the other holder the cluster state
#     names, and completes; a new leader is elected; node 3 then answers node 1's exact greedy text
#     serving alone; the burst's requests to node 2 were each answered or failed with an error
#     naming node 1 (those node 2 had relayed there and that had started);
#   - another helper: node 3, still partial when node 1 (its helper) dies, takes node 2 (which
#     serves the model in its engine) as its helper; a new request to it is answered with node 1's
#     exact text while partial (its /metrics partial tokens grow; its log names the switch).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_source_killed
M=$CL_MODEL
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((10 * HB)) --keep-alive-ms 60000 \
        --replicas-cached 1 --ttft-ms 300 --no-slo "$@"
}
q() { cl_q "n$1" "$2"; } # q N PYEXPR: over node N's /v1/cluster

P="Once upon a time"
N=16
for n in 1 2; do
    node $n -m "$M" --weight-rate 0.1 --test-step-delay-us 100000 --max-batch 2 &&
        cl_ready n$n 30 || { echo "not ok - cluster_source_killed: node $n did not start: $(cl_why n$n)"; exit 1; }
done
REF=$(cl_complete n1 "$P" $N)
[ -n "$REF" ] || { echo "not ok - cluster_source_killed: no reference text: $(cl_why n1)"; exit 1; }
node 3 || { echo "not ok - cluster_source_killed: node 3 did not start: $(cl_why n3)"; exit 1; }
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 20))
BURST=()
for i in $(seq 1 8); do
    for n in 1 2; do
        curl -s -m 120 -o "$W/b$n-$i.json" -w '%{http_code}' "${CL_URL[n$n]}/v1/completions" \
            -d '{"prompt":"'"$LONG"'","max_tokens":24,"temperature":0}' >"$W/b$n-$i.code" &
        BURST+=($!)
    done
done
# node 3 has verified a few spans from node 1: kill node 1
killed=0
for ((i = 0; i < 1800; i++)); do
    if grep -q "from 127.0.0.1:$((CL_BASE + 1))" "$W/n3.log" && grep -q "span 2/[0-9]* verified" "$W/n3.log"; then
        cl_kill n1
        killed=1
        break
    fi
    sleep 0.05
done
if [ $killed = 0 ]; then
    not_ok "source_killed: node 3 never pulled from node 1: $(cl_why n3) | $(cl_why n1)"
    exit $fail
fi
# node 3, still partial, loses its helper (node 1) and takes node 2, which serves the model too, as
# its helper: a new request is answered through node 2 with node 1's exact text, while partial
metric() { curl -s "${CL_URL[$1]}/metrics" | awk -v n="$2" '$1 == n {print $2}'; }
switched=""
for ((i = 0; i < 200; i++)); do
    switched=$(grep -m1 -o "helper 127.0.0.1:$((CL_BASE + 1)) is gone .*" "$W/n3.log")
    [ -n "$switched" ] && break
    sleep 0.05
done
k0=$(metric n3 strata_coop_k)
p0=$(metric n3 strata_coop_partial_tokens_total)
TXT2=$(cl_complete n3 "$P" $N -H 'X-Strata-Route: local') # never relayed to node 2 (idle, faster)
p1=$(metric n3 strata_coop_partial_tokens_total)
if [ -n "$switched" ] && [ "$TXT2" = "$REF" ] && [ "${p1:-0}" -gt "${p0:-0}" ]; then
    ok "source_killed: node 3 (k=$k0, partial) took node 2 as its helper ($switched); a new request got node 1's exact text, $((p1 - p0)) tokens served while partial"
else
    not_ok "source_killed: another helper: switch '$switched', k $k0, partial tokens $p0 -> $p1, text '$TXT2' vs '$REF'"
fi
complete=0
for ((i = 0; i < 1200; i++)); do
    grep -q "every layer here" "$W/n3.log" && { complete=1; break; }
    sleep 0.05
done
leader=""
for ((i = 0; i < 100; i++)); do
    leader=$(q 2 "d['leader'] if d['leader'] in (2, 3) else ''")
    [ -n "$leader" ] && break
    sleep 0.1
done
TXT=$(cl_complete n3 "$P" $N)
if [ $complete = 0 ]; then
    not_ok "source_killed: node 3 never completed after node 1 died: $(cl_why n3)"
elif ! grep -q "resuming from 127.0.0.1:$((CL_BASE + 2))" "$W/n3.log"; then
    not_ok "source_killed: node 3 did not resume from node 2: $(grep -E 'resum|joining from' "$W/n3.log" | tr '\n' '|')"
elif [ -z "$leader" ]; then
    not_ok "source_killed: no new leader after node 1 died: $(q 2 d)"
elif [ "$TXT" != "$REF" ]; then
    not_ok "source_killed: node 3's text differs: '$TXT' vs '$REF'"
else
    ok "source_killed: node 1 (source, leader) killed mid-stream; node 3 resumed from node 2 and completed ($(grep -c 'verified' "$W/n3.log") spans logged), node $leader leads, node 3 answers node 1's exact text"
fi
# The burst's requests sent to node 2 (alive throughout): each one answered, or, if node 2 had
# relayed it to node 1 and it had started there, an error that names node 1; none hangs, none
# gets wrong text (every answer is the same prompt's greedy text).
wait "${BURST[@]}" 2>/dev/null
verdict=$(python3 - "$W" <<'PY'
import glob, json, os, sys
w = sys.argv[1]
ok = err = 0
texts = set()
for f in sorted(glob.glob(os.path.join(w, "b2-*.json"))):
    code = open(f[:-5] + ".code").read().strip()
    try:
        body = json.load(open(f))
    except Exception:
        print("bad: %s: HTTP %s, not JSON" % (os.path.basename(f), code)); sys.exit()
    if code == "200" and "choices" in body:
        ok += 1
        texts.add(body["choices"][0]["text"])
    elif "node 1" in body.get("error", {}).get("message", ""):
        err += 1
    else:
        print("bad: %s: HTTP %s %s" % (os.path.basename(f), code, json.dumps(body)[:200])); sys.exit()
if len(texts) > 1:
    print("bad: %d different texts for one prompt" % len(texts)); sys.exit()
print("ok %d %d" % (ok, err))
PY
)
if [[ "$verdict" == ok* ]]; then
    read -r _ n_ok n_err <<<"$verdict"
    ok "source_killed: the 8 requests sent to node 2 during the kill: $n_ok answered (one text), $n_err failed with an error naming node 1 (started there), none lost silently"
else
    not_ok "source_killed: requests sent to node 2: $verdict"
fi
exit $fail
