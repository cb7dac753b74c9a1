#!/bin/bash
# The simulator against the live cluster, in one run: measures the live scale-out of
# tests/bench/cluster_join.sh (two or more `strata serve` in network namespaces over veth, the
# weight link capped by --weight-rate, a synthetic TinyLlama-shape Q4_0 model), describes that
# setup to `strata sim` with the parameters measured in the same run (the model's spans in bytes,
# the capped rate, veth latency, the source's fitted step model, the joiner's admission model, the
# burst's arrival time and token counts), runs the simulator on it, and prints
#   quantity | measured | predicted | error %
# for one replica's transfer, chains of 2 and 3 joiners, join -> first token and -> every layer,
# and the burst's TTFT P50/P99, live and stop-the-world. A second prediction uses the replica rate
# measured in the run instead of the cap: it separates a wrong link model from a wrong
# pipelining/serving model.
#
# SIM_VALIDATE_NUMBERS=FILE skips the live run and uses figures an earlier one wrote
# (cluster_join.sh's CLUSTER_BENCH_OUT); SIM_VALIDATE_KEEP=DIR keeps the configs, the simulator's
# outputs and the live logs; SIM_VALIDATE_MD=FILE also writes the table as Markdown.
# Minutes (the live part); make bench runs it, never make test. Needs root (namespaces).
set -u
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ] && [ -z "${SIM_VALIDATE_NUMBERS:-}" ]; then
    echo "skip - sim_validate: needs root"
    exit 0
fi
make -s -j2 build/strata build/tools/synth_model >/dev/null || exit 1
STRATA=${STRATA:-build/strata}
MODEL=${CLUSTER_BENCH_MODEL:-build/bench-models/tinyllama-q4_0.gguf}
W=$(mktemp -d /tmp/sim_validate.XXXXXX)
KEEP=${SIM_VALIDATE_KEEP:-}
trap '[ -n "$KEEP" ] && mkdir -p "$KEEP" && cp -r "$W"/. "$KEEP"/; rm -rf "$W"' EXIT

if [ -n "${SIM_VALIDATE_NUMBERS:-}" ]; then
    cp "$SIM_VALIDATE_NUMBERS" "$W/live.env" || exit 1
else
    echo "sim_validate: the live measurement (tests/bench/cluster_join.sh)"
    CLUSTER_BENCH_OUT="$W/live.env" CLUSTER_BENCH_KEEP="$W/live-logs" CLUSTER_BENCH_MODEL="$MODEL" \
        bash tests/bench/cluster_join.sh | sed 's/^/  /'
fi
if [ ! -f "$MODEL" ]; then echo "sim_validate: $MODEL missing"; exit 1; fi
"$STRATA" inspect -v "$MODEL" >"$W/inspect.txt" || exit 1

# Configs and burst files from the measured figures; the simulator; the table.
python3 - "$W" "$STRATA" <<'PY'
import csv, math, os, re, subprocess, sys

w, strata = sys.argv[1], sys.argv[2]
env = {}
for line in open(os.path.join(w, "live.env")):
    k, _, v = line.strip().partition("=")
    if k:
        env[k] = v
need = ["model_bytes", "rate_MBps", "step_us", "burst", "max_batch", "step_tokens", "chain1_s",
        "live_port_s", "live_first_token_s", "live_full_s", "live_ttft_s",
        "stop_the_world_port_s", "stop_the_world_first_token_s", "stop_the_world_full_s",
        "stop_the_world_ttft_s"]
missing = [k for k in need if not env.get(k) or env[k] == "None"]
if missing:
    print("sim_validate: the live run lacks " + ", ".join(missing))
    sys.exit(1)

# The model as the weight stream sends it: the GGUF header first, then the spans in execution
# order (embedding, blocks, head). The header travels before the first span, so it counts with it.
ins = open(os.path.join(w, "inspect.txt")).read()
header = int(re.search(r"data at (\d+)", ins).group(1))
spans = [int(m.group(1)) for m in re.finditer(r"span \d+ \(\w+\): image \[\d+, \+(\d+)\)", ins)]
cfg = re.search(r"layers (\d+), heads \d+ \(kv (\d+), head dim (\d+)\)", ins)
layers, kv_heads, head_dim = (int(x) for x in cfg.groups())
if not spans or header + sum(spans) != int(env["model_bytes"]):
    print("sim_validate: spans (%d bytes) + header (%d) != the model file (%s bytes)"
          % (sum(spans), header, env["model_bytes"]))
    sys.exit(1)
spans[0] += header
runs = []
i = 0
while i < len(spans):
    j = i
    while j < len(spans) and spans[j] == spans[i]:
        j += 1
    runs.append("%d" % spans[i] if j - i == 1 else "%dx%d" % (spans[i], j - i))
    i = j

us = lambda s: ",".join("%.9g" % (float(x) * 1e-6) for x in s.split(","))
rate_Bps = float(env["rate_MBps"]) * 1e6
replica_Bps = int(env["model_bytes"]) / float(env["chain1_s"])


def config(nodes, rate):
    lines = [
        "# tests/bench/sim_validate.sh: the live namespaces setup of tests/bench/cluster_join.sh",
        "gpus = CPU:%d" % nodes, "gpus_per_server = 1", "gpus_per_inst = 1",
        "model_spans = " + ",".join(runs),
        "kv_bytes_tok = %d" % (2 * layers * kv_heads * head_dim * 2),  # f16 K and V
        "nic_gbps = %.9g" % (rate * 8 / 1e9),
        "latency_us = %s" % (env.get("latency_us") or "0"),
        # the weight stream's chunk (transport/weight_stream.c DEFAULT_CHUNK): a chain forwards
        # each 256 KiB as it lands, not each span
        "chunk_bytes = 262144",
        "step = CPU:" + us(env["step_us"]),
        "max_seqs = " + env["max_batch"], "max_step_tokens = " + env["step_tokens"],
        "tbt_slo_ms = 100", "ttft_floor_ms = 1000", "ttft_per_tok_ms = 0",  # serve's defaults
        "planner = off", "initial = 1", "send_to = 1",
        "shuffle = off",  # instance numbers are the live nodes
        "live_min_layers = 1",  # the joiner serves once its embedding (the first span) is in
        "kv_recompute = on",  # and recomputes the KV of each layer that lands
        "scaleout = 0:0:" + ",".join(str(k) for k in range(1, nodes)),
    ]
    js = env.get("live_joiner_step_us")
    if js:  # the joiner skips calibration: its scheduler admits with this model
        lines.append("admit_step = CPU:" + us(js))
    return "\n".join(lines) + "\n"


def burst(mode):
    port = float(env[mode + "_port_s"])
    n = int(env["burst"])
    pin = (env.get(mode + "_prompt_tokens") or "").split(",")
    pout = (env.get(mode + "_completion_tokens") or "").split(",")
    rows = ["seconds,in,out"]
    for k in range(n):
        i = int(pin[k]) if k < len(pin) and pin[k].isdigit() else 8
        o = int(pout[k]) if k < len(pout) and pout[k].isdigit() else int(env.get("tokens", 8))
        rows.append("%.6f,%d,%d" % (port, i, o))
    return "\n".join(rows) + "\n"


def sim(name, conf, reqs, policy):
    d = os.path.join(w, "sim", name)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "sim.conf"), "w").write(conf)
    open(os.path.join(d, "requests.csv"), "w").write(reqs)
    p = subprocess.run([strata, "sim", "--config", os.path.join(d, "sim.conf"), "--requests",
                        os.path.join(d, "requests.csv"), "--policy", policy, "--out", d,
                        "--seeds", "1", "--quiet"], capture_output=True, text=True)
    open(os.path.join(d, "stdout.txt"), "w").write(p.stdout + p.stderr)
    if p.returncode:
        print("sim_validate: strata sim (%s): %s" % (name, (p.stdout + p.stderr).strip()))
        sys.exit(1)
    return next(csv.DictReader(open(os.path.join(d, "summary.csv"))))


def quantile(v, p):  # the simulator's rule: the ceil(p n)-th smallest
    v = sorted(v)
    return v[min(len(v) - 1, max(0, math.ceil(p * len(v)) - 1))]


rows = []  # (quantity, measured, predicted at the cap, predicted at the measured replica rate)
empty = "seconds,in,out\n"
for n in (1, 2, 3):
    if not env.get("chain%d_s" % n):
        continue
    pr = [float(sim("chain%d-%s" % (n, tag), config(n + 1, r), empty,
                    "strata-stop-the-world")["scaleout_max_s"]) for tag, r in
          (("cap", rate_Bps), ("measured", replica_Bps))]
    what = "one replica: join -> every span verified" if n == 1 else \
        "chain of %d joiners: join -> the last one complete" % n
    rows.append((what, float(env["chain%d_s" % n]), pr[0], pr[1]))
for mode, policy in (("live", "strata"), ("stop_the_world", "strata-stop-the-world")):
    res = [sim("%s-%s" % (mode, tag), config(2, r), burst(mode), policy)
           for tag, r in (("cap", rate_Bps), ("measured", replica_Bps))]
    label = mode.replace("_", "-")
    ttft = [float(x) for x in env[mode + "_ttft_s"].split(",") if x not in ("-", "")]
    rows.append(("%s: join -> joiner's first token" % label, float(env[mode + "_first_token_s"]),
                 float(res[0]["first_token_s"]), float(res[1]["first_token_s"])))
    rows.append(("%s: join -> every layer resident" % label, float(env[mode + "_full_s"]),
                 float(res[0]["scaleout_max_s"]), float(res[1]["scaleout_max_s"])))
    for q, col in ((0.5, "ttft_p50_ms"), (0.99, "ttft_p99_ms")):
        rows.append(("%s: burst TTFT P%d" % (label, round(q * 100)), quantile(ttft, q),
                     float(res[0][col]) / 1000, float(res[1][col]) / 1000))

err = lambda p, m: 100 * (p - m) / m if m else float("nan")
print("sim_validate: %s bytes in %d spans, link capped at %s MB/s, replica measured at %.1f MB/s, "
      "veth latency %s us, step %s us/token, us/seq, us" %
      (env["model_bytes"], len(spans), env["rate_MBps"], replica_Bps / 1e6,
       env.get("latency_us") or "0", env["step_us"]))
fmt = "  %-52s %9s %9s %8s %11s %8s"
print(fmt % ("quantity (seconds)", "measured", "predicted", "error", "at replica", "error"))
md = ["| quantity (s) | measured | predicted (link = cap) | error | predicted (link = measured "
      "replica rate) | error |", "| --- | --- | --- | --- | --- | --- |"]
for q, m, p1, p2 in rows:
    print(fmt % (q, "%.3f" % m, "%.3f" % p1, "%+.1f%%" % err(p1, m), "%.3f" % p2,
                 "%+.1f%%" % err(p2, m)))
    md.append("| %s | %.2f | %.2f | %+.1f%% | %.2f | %+.1f%% |" % (q, m, p1, err(p1, m), p2,
                                                                   err(p2, m)))
if os.environ.get("SIM_VALIDATE_MD"):
    open(os.environ["SIM_VALIDATE_MD"], "w").write("\n".join(md) + "\n")
PY
