#!/bin/bash
# docs/grafana/strata.json and docs/prometheus/alerts.yml against live servers: a `strata serve`
# without --cluster and a one-node cluster (it leads itself) on 127.0.0.1, each after a completion;
# tests/lib/ops_checks.py checks the files' shape and that every metric they name is in /metrics.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
python3 -c 'import yaml' 2>/dev/null || { echo "skip - ops_dashboards: needs python3-yaml"; exit 0; }
cl_begin ops_dashboards
cl_serve single -m "$CL_MODEL" && cl_ready single 20 ||
    { echo "not ok - ops_dashboards: the single node did not start: $(cl_why single)"; exit 1; }
cl_serve one -m "$CL_MODEL" --node-id 1 --key-file "$W/key" --raft-dir "$W/raft1" \
    --cluster "1@127.0.0.1:$((CL_BASE + 11))" --cluster-heartbeat-ms 100 && cl_ready one 20 ||
    { echo "not ok - ops_dashboards: the cluster node did not start: $(cl_why one)"; exit 1; }
cl_until 20 one "d['leader'] == 1" || { echo "not ok - ops_dashboards: the one-node cluster has no leader: $(cl_why one)"; exit 1; }
for n in single one; do
    [ -n "$(cl_complete $n "Once upon a time" 4)" ] || not_ok "ops_dashboards: no completion from $n"
    curl -s -m 5 "${CL_URL[$n]}/metrics" >"$W/$n.prom"
done
python3 tests/lib/ops_checks.py "$W/single.prom" "$W/one.prom" || fail=1
# Prometheus's own parser, where Debian's prometheus package (promtool) is installed: the alert
# rules, and the dashboard's queries as recording rules (Grafana's variables filled in).
if command -v promtool >/dev/null; then
    python3 -c '
import json, sys, yaml
d = json.load(open("docs/grafana/strata.json"))
ex = [t["expr"] for p in d["panels"] if p["type"] != "row" for t in p["targets"]]
sub = lambda e: e.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [{"record": "strata:q%d" % i, "expr": sub(e)}
                for i, e in enumerate(ex)]}]}, open(sys.argv[1], "w"))' "$W/dash_rules.yml"
    if out=$(promtool check rules docs/prometheus/alerts.yml "$W/dash_rules.yml" 2>&1); then
        ok "promtool: the alert rules and every dashboard query parse"
    else
        not_ok "promtool: $(tr '\n' ' ' <<<"$out")"
    fi
else
    echo "skip - promtool: not installed (Debian's prometheus package has it)"
fi
exit $fail
