#!/bin/bash
# What forwarding a request costs (issue 14, "Serving as one service"): three `strata serve
# --cluster` on loopback, node 1 serving the tiny model, nodes 2 and 3 standbys that relay every
# completion to it over sealed forward channels (cluster/fwd_channel.h): node 2 keeps idle
# channels (--forward-pool 4, the default), node 3 opens a fresh one per request
# (--forward-pool 0). Figures, side by side, never a pass criterion:
#   - one-token greedy completions, N sequential on one keep-alive client connection: node 1
#     directly, through node 2 (pooled), through node 3 (fresh), median and P90 ms;
#   - the relays' own count: channels opened and reused, the mean open time (TCP connect,
#     HELLO/HELLO_ACK, OPEN) as node 3 measured it;
#   - build/tools/fwd_probe --bench: the same request straight to node 1 over a sealed channel
#     (fresh / kept) and over plain TCP to its API (fresh / kept), medians in microseconds.
#   N=200 tests/bench/cluster_forward.sh
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
W=$(mktemp -d /tmp/cluster_forward_bench.XXXXXX)
trap 'cl_cleanup; rm -rf "$W"' EXIT
N=${N:-200}
PROBE=build/tools/fwd_probe
[ -x "$PROBE" ] || { echo "cluster_forward: $PROBE not built (make)"; exit 1; }
serve_model || { echo "cluster_forward: cannot convert the tiny model"; exit 1; }
M=$(realpath "$SERVE_MODEL")
cl_key "$W/key"
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
COMMON=(-m "$M" --key-file "$W/key" --cluster "$PEERS" --cluster-heartbeat-ms 100
    --cluster-dead-ms 60000 --keep-alive-ms 600000)
cl_serve n1 --node-id 1 --raft-dir "$W/raft1" "${COMMON[@]}" &&
    cl_serve n2 --node-id 2 --raft-dir "$W/raft2" --cluster-standby "${COMMON[@]}" &&
    cl_serve n3 --node-id 3 --raft-dir "$W/raft3" --cluster-standby --forward-pool 0 "${COMMON[@]}" ||
    { echo "cluster_forward: a node did not start"; exit 1; }
cl_ready n1 60 || { echo "cluster_forward: node 1 not ready: $(cl_why n1)"; exit 1; }
want="d['leader'] is not None and all(node(i) is not None and node(i)['alive'] for i in (1, 2, 3)) and hold(1).get('engine') and not hold(2).get('engine')"
cl_until 60 n2 "$want" && cl_until 60 n3 "$want" ||
    { echo "cluster_forward: the standbys never saw node 1 serving: $(cl_q n2 d)"; exit 1; }

# N one-token completions on one keep-alive connection; prints "median p90" in ms.
client() {
    python3 - "$1" "$N" <<'PY'
import http.client, json, sys, time
url, n = sys.argv[1], int(sys.argv[2])
host, port = url[len("http://"):].split(":")
c = http.client.HTTPConnection(host, int(port), timeout=30)
body = json.dumps({"prompt": "Once", "max_tokens": 1, "temperature": 0})
t = []
for i in range(n + 5):
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status
    if i >= 5:  # the first few warm up (a first channel, the allocator)
        t.append((time.perf_counter() - t0) * 1e3)
t.sort()
print(f"{t[len(t) // 2]:.2f} {t[len(t) * 9 // 10]:.2f}")
PY
}
metric() { curl -s -m 5 "${CL_URL[$1]}/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }

d=$(client "${CL_URL[n1]}")
p=$(client "${CL_URL[n2]}")
f=$(client "${CL_URL[n3]}")
echo "# $N one-token completions each, one client connection, median / P90 ms (load $(cut -d' ' -f1 /proc/loadavg))"
echo "node 1 directly: ${d% *} / ${d#* } | through node 2, channels kept: ${p% *} / ${p#* } | through node 3, a fresh channel each: ${f% *} / ${f#* }"
for n in n2 n3; do
    o=$(metric $n strata_forward_channels_opened_total)
    s=$(metric $n strata_forward_channel_open_seconds_total)
    r=$(metric $n strata_forward_channels_reused_total)
    echo "$n: $o channels opened (mean open $(python3 -c "print(f'{$s / max($o, 1) * 1e6:.0f}')") us), $r requests on a kept one"
done
API=${CL_URL[n1]#http://}
"$PROBE" --bench "$N" "$W/key" "127.0.0.1:$((CL_BASE + 11))" "$API" \
    '{"prompt":"Once","max_tokens":1,"temperature":0}' ||
    echo "cluster_forward: fwd_probe --bench failed"
