#!/bin/bash
# Autoscaling against a fixed node (issue 14's figures), the reactive planner against the
# proactive one (issue 24), on the same requests: the Azure conversation trace
# (../shared/traces/azure_llm_2023_conv.csv) sped up.
#   fixed      node 1 alone: `strata serve --cluster 1@...` (a cluster of one, the same code path)
#   auto       (reactive) node 1 plus EMPTY (default 2) empty members (--fabric tcp, no -m): the
#              leader scales out to them when the predicted TTFT passes the SLO, they pull the
#              model from node 1 (paced at RATE MB/s) and serve while it arrives, and node 1
#              forwards requests by the routing table (--cluster-planner reactive)
#   pro        (proactive) the same cluster with --cluster-planner proactive: the leader also
#              scales out when the forecast of the prompt tokens arriving (Holt's smoothing of
#              what the nodes report) passes the replicas' capacity, and scales in busy replicas
#              by handing their sequences over (cluster/coop.h)
# loadgen sends every request to node 1 in every run (the same requests: the trace's first
# REQUESTS at SPEEDUP). Each node's steps are padded to STEP_US
# (--test-step-delay-us): on this 2-core machine that stands for the GPU time of a step, so a
# replica adds capacity the way a GPU would (the compute itself is the tiny model's). Figures:
# SLO attainment, goodput, TTFT P50/P99 (loadgen), and for each scale-up the time from the
# leader's decision (its committed event) to the joiner's first generated token (polled on its
# /metrics every 50 ms) and to k = L (the scale_done event); per autoscaling run the decisions
# with their reasons (the leader's log), the node-seconds the engines were held during the run
# (from the events: node 1 all along, a joiner from its scale-up to its scale-down) and those of
# forecast scale-ups whose joiner served no token (the forecast's false positives).
#   REQUESTS=150 SPEEDUP=4 STEP_US=40000 RATE=0.2 PLANNERS="reactive proactive" \
#   tests/bench/cluster_autoscale.sh
# AUTOSCALE_DIR=DIR runs in DIR and keeps it (the logs, /v1/cluster's events, and loadgen's
# requests as sent, LABEL.requests.csv: what tests/bench/sim_validate_autoscale.sh reads).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
if [ -n "${AUTOSCALE_DIR:-}" ]; then
    W=$AUTOSCALE_DIR KEEP=1
    mkdir -p "$W" || exit 1
else
    W=$(mktemp -d /tmp/cluster_autoscale.XXXXXX)
fi
trap 'cl_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
REQUESTS=${REQUESTS:-150}
SPEEDUP=${SPEEDUP:-4}
STEP_US=${STEP_US:-40000}
RATE=${RATE:-0.2}
EMPTY=${EMPTY:-2}
PLANNERS=${PLANNERS:-reactive proactive}
TTFT_MS=${TTFT_MS:-1000}
TPOT_MS=${TPOT_MS:-200}
LOADGEN=${LOADGEN:-build/tools/loadgen}
TRACE=$SHARED/traces/azure_llm_2023_conv.csv
[ -x "$LOADGEN" ] || { echo "cluster_autoscale: $LOADGEN not built (make)"; exit 1; }
serve_model || { echo "cluster_autoscale: cannot convert the tiny model"; exit 1; }
M=$(realpath "$SERVE_MODEL")
cl_key "$W/key"
HB=100
now_ms() { date +%s%3N; }

run() { # run LABEL N_NODES [PLANNER]
    local label=$1 nn=$2 planner=${3:-reactive} n peers="" port
    for ((n = 1; n <= nn; n++)); do peers="$peers${peers:+,}$n@127.0.0.1:$((CL_BASE + 10 + n))"; done
    for ((n = 1; n <= nn; n++)); do
        local extra=()
        [ $n = 1 ] && extra=(-m "$M" --weight-rate "$RATE")
        cl_serve "$label$n" --node-id $n --key-file "$W/key" --fabric tcp \
            --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft-$label$n" --cluster "$peers" \
            --cluster-heartbeat-ms $HB --keep-alive-ms 20000 --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" \
            --max-batch 8 --test-step-delay-us "$STEP_US" --cluster-planner "$planner" \
            --state-dir off "${extra[@]}" ||
            { echo "cluster_autoscale: node $n did not start: $(tail -n 3 "$W/$label$n.log")"; return 1; }
    done
    cl_ready "${label}1" 30 || { echo "cluster_autoscale: node 1 not ready"; return 1; }
    for ((i = 0; i < 300; i++)); do
        [ "$(curl -s -m 2 "${CL_URL[${label}1]}/v1/cluster" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["leader"] is not None and sum(n["alive"] for n in d["nodes"]) == '"$nn"')' 2>/dev/null)" = True ] && break
        sleep 0.1
    done
    # first generated token on each empty member, polled
    (
        for ((i = 0; i < 4000; i++)); do
            for ((n = 2; n <= nn; n++)); do
                [ -f "$W/$label-first$n" ] && continue
                g=$(curl -s -m 1 "${CL_URL[$label$n]}/metrics" 2>/dev/null | sed -n 's/^strata_generation_tokens_total \([0-9]*\).*/\1/p')
                [ "${g:-0}" -gt 0 ] && now_ms >"$W/$label-first$n"
            done
            sleep 0.05
        done
    ) &
    local poller=$!
    port=${CL_URL[${label}1]##*:}
    "$LOADGEN" --url "http://127.0.0.1:$port" --trace "$TRACE" --requests "$REQUESTS" \
        --speedup "$SPEEDUP" --ctx 512 --vocab 512 --ttft-ms "$TTFT_MS" --tpot-ms "$TPOT_MS" \
        --label "$label" --dump-requests "$W/$label.requests.csv" >"$W/$label.loadgen" 2>&1
    grep RESULT "$W/$label.loadgen" | sed "s/^RESULT /$label ($planner): /"
    now_ms >"$W/$label.end"
    curl -s -m 2 "${CL_URL[${label}1]}/v1/cluster" >"$W/$label.cluster"
    kill $poller 2>/dev/null
    wait $poller 2>/dev/null
    for ((n = nn; n >= 1; n--)); do cl_kill "$label$n"; done
}

echo "cluster_autoscale: $REQUESTS requests of $TRACE at ${SPEEDUP}x; steps padded to $STEP_US us;" \
    "weights paced at $RATE MB/s; SLO TTFT $TTFT_MS ms, TPOT $TPOT_MS ms; $(nproc) CPUs"
run fixed 1
labels=""
for p in $PLANNERS; do
    label=auto
    [ "$p" = proactive ] && label=pro
    run $label $((1 + EMPTY)) "$p"
    labels="$labels $label"
done
python3 - "$W" $labels <<'PY'
import glob, json, os, re, sys
w = sys.argv[1]
for label in sys.argv[2:]:
    d = json.load(open(os.path.join(w, label + ".cluster")))
    ev = d["events"]
    start = float(re.search(r"0 s = unix time ([\d.]+) s",
                            open(os.path.join(w, label + ".requests.csv")).read()).group(1)) * 1e3
    end = float(open(os.path.join(w, label + ".end")).read())
    # the leader's decisions with their reasons, in time order over every node's log
    dec = []
    for f in glob.glob(os.path.join(w, label + "[0-9]*.log")):
        for l in open(f, errors="replace"):
            m = re.match(r"\[\s*([\d.]+)\] cluster: decision: (scale up|scale down|copy|drop) (.*): ([^:]*)$", l)
            if m:
                dec.append((float(m.group(1)), m.group(2), "handing its sequences" in m.group(3),
                            m.group(4).strip()))
    dec.sort()
    ups = [e for e in ev if e["event"] == "scale_up"]
    why = [x[3] for x in dec if x[1] == "scale up"]
    # node-seconds of engines during the run: node 1 all along, a joiner from its scale-up to its
    # scale-down (or the end)
    held, fp = {1: [start, None]}, 0.0
    node_s = 0.0
    for e in ev:
        if e["event"] == "scale_up" and e.get("node") not in held:
            held[e["node"]] = [max(start, e["t_ms"]), None]
        elif e["event"] == "scale_down" and e.get("node") in held and held[e["node"]][1] is None:
            held[e["node"]][1] = e["t_ms"]
    for n, (a, b) in held.items():
        node_s += max(0.0, min(b or end, end) - a) / 1e3
    print("%s: %d scale-ups, %d scale-downs (%d handing sequences over); engines held %.1f node-seconds over the run's %.1f s" % (
        label, len(ups), len([e for e in ev if e["event"] == "scale_down"]),
        len([x for x in dec if x[1] == "scale down" and x[2]]),
        node_s, (end - start) / 1e3))
    for i, up in enumerate(ups):
        done = [e for e in ev if e["event"] == "scale_done" and e["seq"] > up["seq"]
                and e.get("node") == up["node"]]
        first = os.path.join(w, "%s-first%d" % (label, up["node"]))
        ft = int(open(first).read()) if os.path.exists(first) else None
        reason = why[i] if i < len(why) else "?"
        if not ft and "forecast" in reason and up["node"] in held:
            a, b = held[up["node"]]
            fp += max(0.0, min(b or end, end) - a) / 1e3
        print("  scale-up to node %d at %.2f s (%s): decision -> first token %s, -> k = L (scale_done) %s" % (
            up["node"], (up["t_ms"] - start) / 1e3, reason,
            "%.2f s" % ((ft - up["t_ms"]) / 1e3) if ft else "n/a (no token on it)",
            "%.2f s" % ((done[0]["t_ms"] - up["t_ms"]) / 1e3) if done else "n/a"))
    if fp:
        print("  forecast scale-ups that served nothing: %.1f node-seconds" % fp)
    print("  events:", ", ".join("%s(%s)" % (e["event"], e.get("node")) for e in ev))
PY
