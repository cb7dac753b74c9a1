#!/bin/bash
# A node that starts a model takes the step model of a cluster member with the same hardware
# identity when it has none cached (serving/sched/step_prior.h, issue 28): three `strata serve
# --cluster` processes on 127.0.0.1, no step-model cache anywhere (--state-dir off). Node 1 holds
# the tiny model and calibrates while idle; then nodes 2 and 3 join empty, and R = 3 copies the
# model onto both (a join: the scheduler starts there). Node 2 runs with node 1's threads, so its
# identity (the model's header, backend, CPU, ISA, threads, KV type) is node 1's; node 3 runs
# with 2 threads, another identity.
#   - member_prior: node 2 starts from node 1's fitted model (its log names node 1 and the same
#     coefficients node 1 reports in /v1/cluster), calibrated: no idle calibration of its own;
#   - other_hardware: node 3 starts from the default (its own bandwidth), not node 1's.
# About 30 s.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_step_prior
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --replicas-cached 3 --state-dir off "$@"
}
node 1 -m "$CL_MODEL" && cl_ready n1 30 ||
    { echo "not ok - cluster_step_prior: node 1 did not start: $(cl_why n1)"; exit 1; }
# node 1 calibrates while idle (alone it has no quorum: nothing is decided yet)
for ((i = 0; i < 600; i++)); do
    grep -q "sched: step model: .*calibrated while idle" "$W/n1.log" && break
    sleep 0.1
done
SM=$(sed -n 's/.*sched: step model: \([0-9.]*\) us\/token + \([0-9.]*\) us\/sequence + \([0-9.]*\) us, .*calibrated while idle.*/\1 \2 \3/p' "$W/n1.log" | tail -n 1)
[ -n "$SM" ] || { echo "not ok - cluster_step_prior: node 1 never calibrated: $(cl_why n1)"; exit 1; }
node 2 || { echo "not ok - cluster_step_prior: node 2 did not start: $(cl_why n2)"; exit 1; }
node 3 --threads 2 || { echo "not ok - cluster_step_prior: node 3 did not start: $(cl_why n3)"; exit 1; }
for n in 2 3; do
    for ((i = 0; i < 300; i++)); do
        grep -q "step model: " "$W/n$n.log" && break
        sleep 0.1
    done
done
L2=$(grep -m1 "strata serve: step model: " "$W/n2.log")
L3=$(grep -m1 "strata serve: step model: " "$W/n3.log")
# the same coefficients (to 0.2 us: the report carries floats)
same=$(python3 -c '
import re, sys
a = [float(x) for x in sys.argv[1].split()]
m = re.search(r"prior ([\d.]+) us/token \+ ([\d.]+) us/sequence \+ ([\d.]+) us", sys.argv[2])
print(bool(m) and all(abs(float(x) - y) <= 0.2 for x, y in zip(m.groups(), a)))' "$SM" "$L2")
if [ "$same" = True ] && [[ "$L2" == *"node 1's, fitted on the same hardware over every calibration shape; corrected by every step)"* ]]; then
    ok "cluster_step_prior: member_prior: node 2 started from node 1's step model (node 1 reports $SM us, calibrated): '${L2#*step model: }'"
else
    not_ok "cluster_step_prior: member_prior: node 1 reports $SM; node 2 logged '$L2'"
fi
if grep -q "calibrated while idle" "$W/n2.log"; then
    not_ok "cluster_step_prior: member_prior: node 2 calibrated anyway: $(grep -m1 'calibrated while idle' "$W/n2.log")"
fi
if [[ "$L3" == *"a default from"* ]] && [[ "$L3" != *"node 1's"* ]]; then
    ok "cluster_step_prior: other_hardware: node 3 (2 threads) started from the default: '${L3#*step model: }'"
else
    not_ok "cluster_step_prior: other_hardware: node 3 logged '$L3'"
fi
exit $fail
