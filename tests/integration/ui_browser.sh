#!/bin/bash
# The operator's page (GET /) in a real browser: Debian's chromium, headless, driven through the
# DevTools protocol by playwright-core (tests/node, `npm ci` from the lock file; it never downloads
# a browser), by tests/node/ui_check.mjs.
#   - single: a node without --cluster: its row (the model, every layer), no planner, requests/s
#     moving on the chart, nothing fetched from anywhere but the node, no script error;
#   - cluster: three `strata serve --cluster --api-key` on 127.0.0.1 (node 1 holds the model,
#     paced; 2 and 3 are empty), the page opened on node 2: it asks for the key, then shows three
#     members; a burst on node 1 scales out: a joiner's progress bar in the members table moves
#     from below L to L, the chain is drawn, the scale_up event appears with its reason
#     ("predicted TTFT N ms > SLO 300 ms") and then scale_done; tokens/s per node are charted
#     (node 1's /metrics relayed by node 2); nodes 1 and 3 killed: the page says there is no leader.
# Screenshots: build/test-artifacts/ui_single.png, ui_cluster_scaleout.png (mid-stream),
# ui_cluster.png, ui_no_leader.png. Without chromium or playwright-core: skip.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] || { echo "skip - ui_browser: no chromium (scripts/install-deps.sh installs Debian's)"; exit 0; }
command -v node >/dev/null && command -v npm >/dev/null ||
    { echo "skip - ui_browser: node/npm not installed"; exit 0; }
cl_begin ui_browser
if [ ! -d tests/node/node_modules/playwright-core ]; then
    (cd tests/node && npm ci --no-audit --no-fund >"$W/npm.log" 2>&1) ||
        { echo "skip - ui_browser: npm ci could not install playwright-core: $(tail -n1 "$W/npm.log")"; exit 0; }
fi
ART=build/test-artifacts
mkdir -p "$ART"
export CHROMIUM

# ---- single node
cl_serve single -m "$CL_MODEL" --ttft-ms 300 && cl_ready single 20 ||
    { echo "not ok - ui_browser: the single node did not start: $(cl_why single)"; exit 1; }
node tests/node/ui_check.mjs single "${CL_URL[single]}/" "$W" >"$W/single.out" 2>&1
grep -E '^(ok|not ok) - ' "$W/single.out" || echo "not ok - ui_browser single: $(tail -n 3 "$W/single.out" | tr '\n' '|')"
grep -q '^not ok' "$W/single.out" && fail=1
grep -qE '^ok - ' "$W/single.out" || fail=1
cp "$W/ui_single.png" "$ART/" 2>/dev/null
cl_kill single

# ---- three nodes with a key
KEY=sk-ops-$$
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
node_start() { # node_start N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp --api-key "$KEY" \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((15 * HB)) --keep-alive-ms 60000 \
        --replicas-cached 1 --ttft-ms 300 --no-slo "$@"
}
node_start 1 -m "$CL_MODEL" --weight-rate 0.1 --test-step-delay-us 100000 --max-batch 2 &&
    cl_ready n1 30 || { echo "not ok - ui_browser: node 1 did not start: $(cl_why n1)"; exit 1; }
for n in 2 3; do
    node_start $n || { echo "not ok - ui_browser: node $n did not start: $(cl_why n$n)"; exit 1; }
done
cl_q() { # as tests/lib/cluster.sh's, with the key
    curl -s -m 2 -H "Authorization: Bearer $KEY" "${CL_URL[$1]}/v1/cluster" | python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
print($2)" 2>/dev/null
}
cl_until 60 n1 "d['leader'] is not None and len([n for n in d['nodes'] if n['alive']]) == 3" ||
    { echo "not ok - ui_browser: no leader with 3 members: $(cl_why n1)"; exit 1; }

LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 20))
coproc UI { KEY=$KEY BURST_URL="${CL_URL[n1]}/v1/completions" \
    BURST_BODY='{"prompt":"'"$LONG"'","max_tokens":24,"temperature":0}' JOINERS=2,3 \
    node tests/node/ui_check.mjs cluster "${CL_URL[n2]}/" "$W" 2>&1; }
UI_PID_SAVED=$UI_PID
exec 3>&"${UI[1]}"
while IFS= read -r line <&"${UI[0]}"; do
    echo "$line" >>"$W/cluster.out"
    case $line in
    "# kill") cl_kill n1; cl_kill n3; echo go >&3 ;;
    "ok - "* | "not ok - "*) echo "$line" ;;
    esac
done
exec 3>&-
wait "$UI_PID_SAVED" 2>/dev/null
grep -q '^not ok' "$W/cluster.out" && fail=1
grep -q '^ok - cluster: no leader' "$W/cluster.out" ||
    { grep -q '^not ok' "$W/cluster.out" || echo "not ok - ui_browser cluster: $(tail -n 3 "$W/cluster.out" | tr '\n' '|')"; fail=1; }
cp "$W"/ui_cluster*.png "$W"/ui_no_leader.png "$ART/" 2>/dev/null
exit $fail
