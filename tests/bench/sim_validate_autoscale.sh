#!/bin/bash
# The simulator against the live cluster autoscaling on its own, in one run: runs
# tests/bench/cluster_autoscale.sh once (node 1 with the tiny model and EMPTY empty members, the
# Azure conversation trace sped up, sent by loadgen to node 1; a fixed run of node 1 alone, then
# the autoscaling runs in which the leader's planner scales out: reactive, then proactive on the
# same requests), reads what they measured (node 1's step model: the fit its idle calibration
# logged, else the one it reported at the end of the run, the step padding counted inside it; the
# model's spans, the weight rate, the scheduler's batch limits, and loadgen's requests exactly as
# sent: --dump-requests), describes the same cluster to `strata sim` with the planner ON (the same
# planner code, its own decisions: policy strata-reactive for the reactive run, strata for the
# proactive one, the leading signal and hand-over scale-in as live with --cluster-planner
# proactive), and prints
#   quantity | measured | predicted (link = the cap) | error | predicted (link = measured) | error
# for SLO attainment and TTFT P50/P99 of every run, and per autoscaling run its scale-ups, the time
# of each decision after the start, decision -> the joiner's first token and -> k = L.
# The second prediction sets the simulated link to the rate the joiner's copy ran at in this run
# (the weight stream's token bucket lets the first 256 KiB chunk go unpaced, a quarter of this
# model): it separates the link model from the planner and serving model.
#
# Environment: cluster_autoscale.sh's (REQUESTS, SPEEDUP, STEP_US, RATE, EMPTY, TTFT_MS, TPOT_MS,
# PLANNERS);
# SIM_VALIDATE_DIR=DIR keeps the live run, the configs and the simulator's outputs there (else a
# temporary directory, removed); SIM_VALIDATE_LIVE=DIR skips the live run and reads one kept by
# an earlier run (its AUTOSCALE_DIR); SIM_VALIDATE_MD=FILE also writes the table as Markdown.
# About two and a half minutes (the live part); make bench material, never make test.
#   REQUESTS=200 SPEEDUP=8 tests/bench/sim_validate_autoscale.sh
set -u
cd "$(dirname "$0")/../.."
make -s -j2 build/strata build/tools/loadgen >/dev/null || exit 1
STRATA=${STRATA:-build/strata}
MODEL=${SERVE_MODEL:-build/test-models/stories260K.gguf}
export REQUESTS=${REQUESTS:-200} SPEEDUP=${SPEEDUP:-8} STEP_US=${STEP_US:-40000} RATE=${RATE:-0.2}
export EMPTY=${EMPTY:-2} TTFT_MS=${TTFT_MS:-1000} TPOT_MS=${TPOT_MS:-200}
export PLANNERS=${PLANNERS:-reactive proactive}
if [ -n "${SIM_VALIDATE_DIR:-}" ]; then
    W=$SIM_VALIDATE_DIR
    mkdir -p "$W" || exit 1
else
    W=$(mktemp -d /tmp/sim_validate_autoscale.XXXXXX)
    trap 'rm -rf "$W"' EXIT
fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
if [ -n "${SIM_VALIDATE_LIVE:-}" ]; then
    LIVE=$SIM_VALIDATE_LIVE
    LOAD_BEFORE="n/a (an earlier run; now $LOAD_BEFORE)"
else
    LIVE=$W/live
    rm -rf "$LIVE"
    echo "sim_validate_autoscale: the live run (tests/bench/cluster_autoscale.sh), load average $LOAD_BEFORE"
    AUTOSCALE_DIR=$LIVE bash tests/bench/cluster_autoscale.sh | sed 's/^/  /'
fi
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
[ -n "${SIM_VALIDATE_LIVE:-}" ] && LOAD_AFTER="n/a"
[ -f "$MODEL" ] || { echo "sim_validate_autoscale: $MODEL missing"; exit 1; }
"$STRATA" inspect -v "$MODEL" >"$W/inspect.txt" || exit 1

python3 - "$W" "$LIVE" "$STRATA" "$LOAD_BEFORE" "$LOAD_AFTER" <<'PY'
import csv, json, os, re, subprocess, sys

w, live, strata, load_before, load_after = sys.argv[1:6]
E = os.environ
step_us, rate_Bps = float(E["STEP_US"]), float(E["RATE"]) * 1e6
n_nodes = 1 + int(E["EMPTY"])


def die(msg):
    print("sim_validate_autoscale: " + msg)
    sys.exit(1)


def read(name):
    p = os.path.join(live, name)
    if not os.path.exists(p):
        die("the live run has no %s (did it fail? see %s)" % (name, live))
    return open(p).read()


# The model as the weight stream sends it: the header travels with the first span.
ins = open(os.path.join(w, "inspect.txt")).read()
header = int(re.search(r"data at (\d+)", ins).group(1))
spans = [int(m.group(1)) for m in re.finditer(r"span \d+ \(\w+\): image \[\d+, \+(\d+)\)", ins)]
layers, kv_heads, head_dim = (int(x) for x in re.search(
    r"layers (\d+), heads \d+ \(kv (\d+), head dim (\d+)\)", ins).groups())
model_bytes = header + sum(spans)
spans[0] += header


def node_figures(label):
    """node 1's step model (seconds, the padding inside) and its scheduler's batch limits: the fit
    its idle calibration logged (a start logs only its prior, "step model: prior ..."), else the
    model it reported at the end of the run (/v1/cluster)"""
    log = read(label + "1.log")
    fits = re.findall(r"step model: ([\d.]+) us/token \+ ([\d.]+) us/sequence \+ ([\d.]+) us, "
                      r"error [\d.]+% \(calibrated", log)
    r = re.search(r"max batch (\d+), (\d+) tokens/step", log)
    if not r:
        die("node 1's log has no ready line")
    if fits:
        return [float(x) * 1e-6 for x in fits[-1]], int(r.group(1)), int(r.group(2)), "calibrated"
    for n in json.loads(read(label + ".cluster"))["nodes"]:
        sm = n.get("load", {}).get("step_model")
        if n["id"] == 1 and sm and (sm["a_us"] > 0 or sm["c_us"] > 0):
            return ([sm["a_us"] * 1e-6, sm["b_us"] * 1e-6, sm["c_us"] * 1e-6], int(r.group(1)),
                    int(r.group(2)), "reported, %d steps" % sm["steps"])
    die("node 1 neither calibrated nor reported a step model")


def result(name):
    m = re.search(r"^RESULT (.*)$", read(name), re.M)
    if not m:
        die("%s has no RESULT line" % name)
    return {k: float(v) if re.match(r"^-?[\d.]+$", v) else v
            for k, v in (kv.split("=", 1) for kv in m.group(1).split())}


def requests(name):
    text = read(name)
    start = float(re.search(r"0 s = unix time ([\d.]+) s", text).group(1))
    return text, start


def ser(v):
    return ",".join("%.9g" % x for x in v)


def config(nodes, step, max_batch, step_tokens, link_Bps):
    a, b, c = step
    return "\n".join([
        "# tests/bench/sim_validate_autoscale.sh: tests/bench/cluster_autoscale.sh's cluster",
        "gpus = CPU:%d" % nodes, "gpus_per_server = 1", "gpus_per_inst = 1",
        "model_spans = " + ",".join(str(x) for x in spans),
        "kv_bytes_tok = %d" % (2 * layers * kv_heads * head_dim * 2),  # f16 K and V
        "nic_gbps = %.9g" % (link_Bps * 8 / 1e9), "latency_us = 0",
        "chunk_bytes = 262144",  # the weight stream's chunk
        # a step takes the fitted compute plus the padding (--test-step-delay-us), which is slept
        # inside the step's time: the fit (calibration's or the steps') has it already, and the
        # node admits with and reports to the planner that model
        "step = CPU:" + ser((a, b, c)),
        "admit_step = CPU:" + ser((a, b, c)),
        "plan_step = CPU:" + ser((a, b, c)),
        "max_seqs = %d" % max_batch, "max_step_tokens = %d" % step_tokens,
        "ttft_floor_ms = %s" % E["TTFT_MS"], "ttft_per_tok_ms = 0", "tbt_slo_ms = %s" % E["TPOT_MS"],
        "initial = 1", "replicas_cached = 1",  # `strata serve --cluster`'s default R
        "shuffle = off",  # instance numbers are the live nodes
        "keep_alive_s = 20", "tick_ms = 100",  # --keep-alive-ms 20000, --cluster-heartbeat-ms 100
        "live_min_layers = 1",  # the joiner serves once its embedding (the first span) is in
        "kv_recompute = on", ""])


def sim(name, conf, reqs, policy):
    d = os.path.join(w, "sim", name)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "sim.conf"), "w").write(conf)
    open(os.path.join(d, "requests.csv"), "w").write(reqs)
    p = subprocess.run([strata, "sim", "--config", os.path.join(d, "sim.conf"), "--requests",
                        os.path.join(d, "requests.csv"), "--policy", policy,
                        "--out", d, "--seeds", "1", "--quiet"], capture_output=True, text=True,
                       env=dict(E, STRATA_SIM_TRACE="1"))
    open(os.path.join(d, "stdout.txt"), "w").write(p.stdout + p.stderr)
    if p.returncode:
        die("strata sim (%s): %s" % (name, (p.stdout + p.stderr).strip()[-400:]))
    summ = next(csv.DictReader(open(os.path.join(d, "summary.csv"))))
    ups, first, full = [], {}, {}
    for line in p.stderr.splitlines():
        m = re.match(r"sim: " + re.escape(policy) + r": t=([\d.]+) (.*)$", line)
        if not m:
            continue
        t, what = float(m.group(1)), m.group(2)
        u = re.match(r"scale-up source \d+ node (\d+)", what)
        if u:
            ups.append((t, int(u.group(1))))
        f = re.match(r"instance (\d+) first token", what)
        if f:
            first.setdefault(int(f.group(1)), t)
        k = re.match(r"instance (\d+) holds every layer", what)
        if k:
            full.setdefault(int(k.group(1)), t)
    return summ, ups, first, full


# The live runs' figures: the fixed run, and each autoscaling run with its simulated policy.
RUNS = [(l, pol, name) for l, pol, name, planner in
        (("auto", "strata-reactive", "reactive", "reactive"),
         ("pro", "strata", "proactive", "proactive"))
        if planner in E["PLANNERS"].split()]
fixed_step, max_batch, step_tokens, fixed_src = node_figures("fixed")
fixed_res = result("fixed.loadgen")
fixed_reqs, _ = requests("fixed.requests.csv")


def live_scaleups(label, start):
    """(decision s after the start, node, -> first token s, -> k = L s) per scale-up"""
    ev = json.loads(read(label + ".cluster"))["events"]
    out = []
    for up in [e for e in ev if e["event"] == "scale_up"]:
        done = [e for e in ev if e["event"] == "scale_done" and e["seq"] > up["seq"]
                and e.get("node") == up["node"]]
        fp = os.path.join(live, "%s-first%d" % (label, up["node"]))
        ft = int(open(fp).read()) if os.path.exists(fp) else None
        out.append((up["t_ms"] / 1e3 - start, up["node"], (ft - up["t_ms"]) / 1e3 if ft else None,
                    (done[0]["t_ms"] - up["t_ms"]) / 1e3 if done else None))
    return out


def copy_rate(label, ups):
    """the rate the first joiner's copy ran at: its log, from executing the scale-up to every
    span verified (monotonic seconds)"""
    if not ups:
        return None
    jl = read("%s%d.log" % (label, ups[0][1]))
    t0 = re.search(r"\[\s*([\d.]+)\] cluster: executing scale-up", jl)
    t1 = re.search(r"\[\s*([\d.]+)\] loader: \S+ every span verified", jl)
    if t0 and t1 and float(t1.group(1)) > float(t0.group(1)):
        return model_bytes / (float(t1.group(1)) - float(t0.group(1)))
    return None


runs = []  # (label, policy, name, result, step, step source, live ups, predictions per link)
for label, policy, name in RUNS:
    step, _, _, src = node_figures(label)
    res = result(label + ".loadgen")
    reqs, start = requests(label + ".requests.csv")
    ups = live_scaleups(label, start)
    rate = copy_rate(label, ups)
    links = [("cap", rate_Bps)] + ([("measured", rate)] if rate else [])
    pr = [sim("%s-%s" % (label, tag), config(n_nodes, step, max_batch, step_tokens, r), reqs, policy)
          for tag, r in links]
    runs.append((label, policy, name, res, step, src, ups, pr, rate))
measured_rate = next((r[8] for r in runs if r[8]), None)
links = [("cap", rate_Bps)] + ([("measured", measured_rate)] if measured_rate else [])
pf = [sim("fixed-" + tag, config(1, fixed_step, max_batch, step_tokens, r), fixed_reqs,
          "strata-reactive") for tag, r in links]

rows = []  # (quantity, unit, measured, [predicted per link])
for label, res, pr in [("fixed", fixed_res, pf)] + [(r[2], r[3], r[7]) for r in runs]:
    rows.append(("%s: SLO attainment" % label, "%", res["slo_pct"],
                 [100 * float(s["slo_attainment"]) for s, _, _, _ in pr]))
    for q in ("p50", "p99"):
        rows.append(("%s: TTFT %s" % (label, q.upper()), "s", res["ttft_%s_ms" % q] / 1e3,
                     [float(s["ttft_%s_ms" % q]) / 1e3 for s, _, _, _ in pr]))


def sim_up(p, i):
    """the simulator's i-th scale-up: (decision, -> the joiner's first token, -> k = L)"""
    _, ups, first, full = p
    if i >= len(ups):
        return None, None, None
    t, node = ups[i]
    return (t, first[node] - t if node in first else None,
            full[node] - t if node in full else None)


for label, policy, name, res, step, src, live_ups, pa, rate in runs:
    rows.append(("%s: scale-ups" % name, "", len(live_ups), [len(u) for _, u, _, _ in pa]))
    for i in range(max([len(live_ups)] + [len(u) for _, u, _, _ in pa])):
        pu = [sim_up(p, i) for p in pa]
        lu = live_ups[i] if i < len(live_ups) else (None, None, None, None)
        nth = ("first", "second", "third")[i] if i < 3 else "#%d" % (i + 1)
        rows.append(("%s: %s scale-up decision after the start" % (name, nth), "s", lu[0],
                     [x[0] for x in pu]))
        rows.append(("%s: %s scale-up: decision -> first token" % (name, nth), "s", lu[2],
                     [x[1] for x in pu]))
        rows.append(("%s: %s scale-up: decision -> k = L" % (name, nth), "s", lu[3],
                     [x[2] for x in pu]))


def f(x, unit):
    if x is None:
        return "n/a"
    return "%d" % x if unit == "" else "%.1f" % x if unit == "%" else "%.2f" % x


def err(p, m, unit):
    if p is None or m is None or not m:
        return "n/a"
    if unit == "%":  # attainment: the difference in points
        return "%+.1f pt" % (p - m)
    if unit == "":
        return "%+d" % (p - m)
    return "%+.1f%%" % (100 * (p - m) / m)


print("sim_validate_autoscale: %d nodes (1 holding the model, %d empty), %d requests at %sx; "
      "model %d bytes in %d spans; link capped at %.2f MB/s, the joiner's copy measured at %s; "
      "node 1's step model %.1f us/token + %.1f us/seq + %.1f us (fixed run, %s)%s, steps padded "
      "by %.0f us inside them; max batch %d, %d tokens/step; load average %s before, %s after" %
      (n_nodes, n_nodes - 1, int(E["REQUESTS"]), E["SPEEDUP"], model_bytes, len(spans),
       rate_Bps / 1e6, "%.3f MB/s" % (measured_rate / 1e6) if measured_rate else "n/a",
       *(x * 1e6 for x in fixed_step), fixed_src,
       "".join(", %.1f + %.1f + %.1f (%s run, %s)" % (*(x * 1e6 for x in r[4]), r[2], r[5])
               for r in runs),
       step_us, max_batch, step_tokens, load_before, load_after))
for label, policy, name, res, step, src, live_ups, pa, rate in runs:
    print("  %s: live scale-ups (s after the start, node): %s; simulated (%s, link = cap): %s" % (
        name, ", ".join("%.2f->%d" % (t, n) for t, n, _, _ in live_ups) or "none", policy,
        ", ".join("%.2f->%d" % (t, n + 1) for t, n in pa[0][1]) or "none"))
fmt = "  %-57s %9s %9s %9s %11s %9s"
print(fmt % ("quantity", "measured", "predicted", "error", "at measured", "error"))
md = ["| quantity | measured | predicted (link = cap) | error | predicted (link = measured "
      "copy rate) | error |", "| --- | --- | --- | --- | --- | --- |"]
for q, unit, m, ps in rows:
    ps = ps + [None] * (2 - len(ps))
    name = q + (" (%s)" % unit if unit else "")
    print(fmt % (name, f(m, unit), f(ps[0], unit), err(ps[0], m, unit), f(ps[1], unit),
                 err(ps[1], m, unit)))
    md.append("| %s | %s | %s | %s | %s | %s |" % (name, f(m, unit), f(ps[0], unit),
                                                  err(ps[0], m, unit), f(ps[1], unit),
                                                  err(ps[1], m, unit)))
if E.get("SIM_VALIDATE_MD"):
    open(E["SIM_VALIDATE_MD"], "w").write("\n".join(md) + "\n")
PY
