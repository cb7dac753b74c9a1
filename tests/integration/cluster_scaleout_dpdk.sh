#!/bin/bash
# The cluster's scale-out with the weights and activations on DPDK (net_af_packet on a veth pair
# between two network namespaces, tests/lib/fabric_netns.sh). The control plane (raft) and the
# API use the kernel stack on the same interface, on another subnet (10.78.0.N), as on the
# appliance where DPDK owns the data path and the kernel the exception path. Node 1 serves the
# tiny model; node 2 is an empty member (--fabric dpdk, no -m).
#   - dpdk_scaleout: a burst on node 1 makes the leader scale out to node 2, which pulls the model
#     over DPDK, answers node 1's exact greedy text while it holds fewer than L layers (node 1 runs
#     the rest over DPDK), and reaches k = L (scale_done committed).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
. tests/lib/serve.sh
if [ "$(id -u)" != 0 ]; then echo "skip - cluster_scaleout_dpdk: needs root for network namespaces"; exit 0; fi
ls /usr/lib/*/dpdk/pmds-*/librte_net_af_packet.so >/dev/null 2>&1 ||
    { echo "skip - cluster_scaleout_dpdk: DPDK's net_af_packet driver is not installed"; exit 0; }
[ -x "$STRATA" ] || { echo "not ok - cluster_scaleout_dpdk: $STRATA not built"; exit 1; }
W=$(mktemp -d /tmp/cluster_scaleout_dpdk.XXXXXX)
trap 'fab_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
serve_model || { echo "not ok - cluster_scaleout_dpdk: cannot convert the model"; exit 1; }
M=$(realpath "$SERVE_MODEL")
fab_setup 2 1500 dpdk || { echo "not ok - cluster_scaleout_dpdk: namespaces"; exit 1; }
for i in 1 2; do ip -n "$(fab_ns $i)" addr add "10.78.0.$i/24" dev eth0; done
fab_key "$W/key"
EAL="-l 0 --no-pci --no-huge --no-shconf -m 256 --log-level=lib.*:error --vdev=net_af_packet0,iface=eth0,blocksz=4096,framesz=2048,framecnt=1024,qdisc_bypass=0"
PEERS="1@10.78.0.1:7100,2@10.78.0.2:7100"
node() { # node N ARGS...
    local n=$1
    shift
    fab_bg "$n" "$W/n$n" "$STRATA" serve --host "10.78.0.$n" --port 8080 --threads 1 -v \
        --node-id "$n" --key-file "$W/key" --fabric dpdk --eal "$EAL" --listen "10.77.0.$n:7000" \
        --raft-dir "$W/raft$n" --cluster "$PEERS" --cluster-heartbeat-ms 100 \
        --keep-alive-ms 60000 --ttft-ms 300 --no-slo "$@"
}
api() { ip netns exec "$(fab_ns "$1")" curl -s -m 60 "http://10.78.0.$1:8080$2" "${@:3}"; }
complete() { # complete N PROMPT TOKENS
    api "$1" /v1/completions -d "{\"prompt\":\"$2\",\"max_tokens\":$3,\"temperature\":0}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null
}
q() { # q N PYEXPR over node N's /v1/cluster as d
    api "$1" /v1/cluster | python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
events = lambda kind: [e for e in d['events'] if e['event'] == kind]
print($2)" 2>/dev/null
}
why() { tail -n 5 "$W/$1.err" | tr '\n' '|'; }

node 1 -m "$M" --weight-rate 0.1 --test-step-delay-us 100000 --max-batch 2
for ((i = 0; i < 300; i++)); do api 1 /health -f -o /dev/null && break; sleep 0.1; done
P="Once upon a time"
REF=$(complete 1 "$P" 16)
[ -n "$REF" ] || { echo "not ok - dpdk_scaleout: node 1 did not serve: $(why n1)"; exit 1; }
node 2
LONG=$(printf 'Once upon a time there was a little girl who liked to play. %.0s' $(seq 1 20))
BURST=()
for i in $(seq 1 10); do
    api 1 /v1/completions -o /dev/null -d '{"prompt":"'"$LONG"'","max_tokens":24,"temperature":0}' &
    BURST+=($!)
done
asked=0 seen=""
for ((i = 0; i < 1800; i++)); do
    h=$(api 2 /health -m 2)
    st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' <<<"$h")
    if [ "$st" = partial ] && [ $asked = 0 ]; then
        seen=$(sed -n 's/.*"layers_resident":\([0-9]*\).*/k=\1/p' <<<"$h")
        complete 2 "$P" 16 >"$W/partial.txt" &
        asked=$!
    fi
    [ "$st" = ready ] && break
    sleep 0.05
done
[ $asked != 0 ] && wait $asked
done_ok=0
for ((i = 0; i < 300; i++)); do
    [ "$(q 2 "any(e['node'] == 2 for e in events('scale_done'))")" = True ] && { done_ok=1; break; }
    sleep 0.1
done
TXT=$(cat "$W/partial.txt" 2>/dev/null)
if [ $asked = 0 ]; then
    not_ok "dpdk_scaleout: node 2 never served while partial: $(why n2)"
elif ! grep -q "transport dpdk\|dpdk" "$W/n2.err" || ! grep -q "cluster: pulling" "$W/n2.err"; then
    not_ok "dpdk_scaleout: node 2 did not pull over DPDK: $(why n2)"
elif [ "$TXT" != "$REF" ]; then
    not_ok "dpdk_scaleout: text while partial differs: '$TXT' vs '$REF'"
elif [ $done_ok = 0 ]; then
    not_ok "dpdk_scaleout: no scale_done for node 2: $(q 2 "d['events']")"
else
    ok "dpdk_scaleout: leader scaled out to node 2 over DPDK; asked while partial ($seen) it answered node 1's exact text; k = L (scale_done committed)"
fi
for p in "${BURST[@]}"; do kill "$p" 2>/dev/null; done
wait "${BURST[@]}" 2>/dev/null
exit $fail
