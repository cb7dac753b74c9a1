#!/bin/bash
# Cooperative execution over the DPDK fabric (net_af_packet on a veth pair between two network
# namespaces, tests/lib/fabric_netns.sh): a helper `strata serve` holding the whole model and a
# joiner running layers [0, k) with k rising mid-request; the joiner's greedy output for
# concurrent requests must be byte-identical to the helper serving alone. Each API is on the
# loopback of its namespace.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
STRATA=${STRATA:-build/strata}
SHARED=${STRATA_SHARED:-../shared}
if [ "$(id -u)" != 0 ]; then echo "skip - cluster_dpdk: needs root for network namespaces"; exit 0; fi
ls /usr/lib/*/dpdk/pmds-*/librte_net_af_packet.so >/dev/null 2>&1 ||
    { echo "skip - cluster_dpdk: DPDK's net_af_packet driver is not installed"; exit 0; }
W=$(mktemp -d /tmp/cluster_dpdk.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
MODEL=${SERVE_MODEL:-build/test-models/stories260K.gguf}
if [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    "$STRATA" convert --tokenizer "$SHARED/models/tok512.bin" "$SHARED/models/stories260K.bin" \
        "$MODEL" >/dev/null 2>&1 || { echo "not ok - cluster_dpdk: cannot convert the model"; exit 1; }
fi
fab_setup 2 1500 dpdk || { echo "not ok - cluster_dpdk: namespaces"; exit 1; }
fab_key "$W/key"
EAL="-l 0 --no-pci --no-huge --no-shconf -m 256 --log-level=lib.*:error --vdev=net_af_packet0,iface=eth0,blocksz=4096,framesz=2048,framecnt=1024,qdisc_bypass=0"

serve_in() { # serve_in NODE NAME ARGS...: strata serve in NODE's namespace, API on its loopback
    local node=$1 name=$2
    shift 2
    fab_bg "$node" "$W/$name" "$STRATA" serve -m "$MODEL" --host 127.0.0.1 --port 8080 --threads 1 \
        -v --fabric dpdk --listen "10.77.0.$node:7000" --key-file "$W/key" --eal "$EAL" "$@"
}
api_ready() { # api_ready NODE
    local i
    for ((i = 0; i < 200; i++)); do
        ip netns exec "$(fab_ns "$1")" curl -sf -o /dev/null http://127.0.0.1:8080/health && return 0
        sleep 0.1
    done
    return 1
}

serve_in 1 helper
serve_in 2 joiner --peers 10.77.0.1:7000 --resident-schedule 0:0,4:1,10:3,30:5
if ! api_ready 1 || ! api_ready 2 || ! fab_wait_line "$W/joiner.err" "coop: helper .* connected" 20; then
    echo "not ok - cluster_dpdk: the nodes did not come up: $(tail -n 3 "$W/joiner.err" "$W/helper.err" | tr '\n' ' ')"
    exit 1
fi
# The helper's own answers (single node) from namespace 1, the joiner's from namespace 2: the
# checks client runs once per namespace, each writing its texts.
ip netns exec "$(fab_ns 1)" python3 - >"$W/ref.json" <<'PY'
import json, sys
sys.argv = ["x"]
exec(open("tests/lib/cluster_checks.py").read().split("def main():")[0])
print(json.dumps([complete("http://127.0.0.1:8080", p, 80 + 17 * i, 0.0, 7 + i) for i, p in enumerate(PROMPTS)]))
PY
ip netns exec "$(fab_ns 2)" python3 - >"$W/got.json" <<'PY'
import json, sys, threading
exec(open("tests/lib/cluster_checks.py").read().split("def main():")[0])
got = [None] * len(PROMPTS)
def one(i):
    got[i] = complete("http://127.0.0.1:8080", PROMPTS[i], 80 + 17 * i, 0.0, 7 + i, stream=(i == 1))
th = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
[t.start() for t in th]
[t.join() for t in th]
print(json.dumps(got))
PY
steps=$(ip netns exec "$(fab_ns 2)" curl -s http://127.0.0.1:8080/metrics | awk '$1 == "strata_coop_remote_steps_total" {print $2}')
if cmp -s "$W/ref.json" "$W/got.json" && [ -s "$W/ref.json" ] && [ "${steps:-0}" -gt 0 ]; then
    echo "ok - coop over DPDK net_af_packet, k 0->1->3->5 mid-request, 4 concurrent: identical to single-node ($steps steps split, $(wc -c <"$W/ref.json") bytes)"
else
    echo "not ok - coop over DPDK: steps $steps; ref $(head -c 200 "$W/ref.json"); got $(head -c 200 "$W/got.json"); $(tail -n 3 "$W/joiner.err")"
    exit 1
fi
exit 0
