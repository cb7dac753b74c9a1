"""ops_checks: the dashboards and alert rules in docs/ against live /metrics (tests/integration/ops_dashboards.sh).

    python3 tests/lib/ops_checks.py SINGLE_METRICS_FILE CLUSTER_METRICS_FILE

Prints one ok / not ok line per check: the Grafana JSON and the alert rules parse and have the
fields Grafana and Prometheus need; every strata_ metric they name exists in a live node's
/metrics (those of the control plane, strata_cluster_*, in a cluster node's; the rest in both a
node without --cluster and a cluster node's); each metric family is declared once; the names
vLLM's replaced are gone."""
import json
import re
import sys

import yaml

fail = 0


def check(name, good, why=""):
    global fail
    print(f"ok - {name}" if good else f"not ok - {name}: {why}")
    if not good:
        fail = 1


def families(text):
    """Names a scrape offers: series names, and every declared family (with a histogram's
    _bucket/_sum/_count), so a counter with no labelled series yet still counts."""
    names, declared = set(), []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            declared.append(name)
            names.add(name)
            if kind == "histogram":
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names, declared


single_text = open(sys.argv[1]).read()
cluster_text = open(sys.argv[2]).read()
single, single_decl = families(single_text)
cluster, cluster_decl = families(cluster_text)
check("metrics: a node without --cluster serves its families", "strata_requests_total" in single,
      single_text[:200])
check("metrics: a cluster node serves the control plane's", "strata_cluster_leader" in cluster,
      cluster_text[:200])
for label, decl in (("single node", single_decl), ("cluster node", cluster_decl)):
    dup = sorted({n for n in decl if decl.count(n) > 1})
    check(f"metrics: every family declared once ({label})", not dup, " ".join(dup))
old = ["strata_generated_tokens_total", "strata_preemptions_total", "strata_request_latency_seconds",
       "strata_queue_time_seconds", "strata_requests_running", "strata_requests_waiting",
       "strata_time_per_output_token_seconds"]
gone = [n for n in old if n in single or n in cluster]
check("metrics: the names vLLM's replaced are gone", not gone, " ".join(gone))

# ---- the dashboard
dash = json.load(open("docs/grafana/strata.json"))
exprs = []
panels = [p for p in dash["panels"] if p["type"] != "row"]
bad = [p["title"] for p in panels if not p.get("targets") or "datasource" not in p]
check(f"grafana: {len(panels)} panels, each with a datasource and queries", not bad, " ".join(bad))
ids = [p["id"] for p in dash["panels"]]
check("grafana: panel ids unique", len(ids) == len(set(ids)), str(ids))
cells = {}
overlap = []
for p in dash["panels"]:
    g = p["gridPos"]
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            if (x, y) in cells:
                overlap.append((p["title"], cells[(x, y)]))
            cells[(x, y)] = p["title"]
check("grafana: no two panels overlap, none past 24 columns",
      not overlap and all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in dash["panels"]),
      str(overlap[:3]))
for p in panels:
    exprs += [t["expr"] for t in p["targets"]]
exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]

# ---- the alert rules
rules = yaml.safe_load(open("docs/prometheus/alerts.yml"))
alerts = [r for g in rules["groups"] for r in g["rules"]]
bad = [r.get("alert", "?") for r in alerts
       if not r.get("alert") or not r.get("expr") or r.get("labels", {}).get("severity") is None
       or not r.get("annotations", {}).get("summary")]
check(f"alerts: {len(alerts)} rules, each with an expression, a severity and a summary", not bad,
      " ".join(bad))
names = [r["alert"] for r in alerts]
check("alerts: names unique", len(names) == len(set(names)), str(names))
exprs += [r["expr"] for r in alerts]

# ---- every metric they name exists
used = sorted({m for e in exprs for m in re.findall(r"\bstrata_[a-z0-9_]+", e)})
missing = []
for m in used:
    if m.startswith("strata_cluster_"):
        if m not in cluster:
            missing.append(f"{m} (cluster)")
    else:
        missing += [f"{m} ({where})" for where, have in (("single", single), ("cluster", cluster))
                    if m not in have]
check(f"dashboards and alerts: all {len(used)} metrics they name exist in a live /metrics",
      not missing and len(used) > 20, " ".join(missing) or f"only {len(used)}")
sys.exit(fail)
