#!/bin/bash
# A helper's throughput while it has its own clients and serves a joiner (cluster/coop.h), with the
# joiner's steps fused into the helper's own (--coop-fuse on, the default) against run apart, between
# the helper's steps (--coop-fuse off), in the same run, for a few k (the layers the joiner holds).
# A synthetic stories110M-shape Q8_0 model (12 layers; tests/tools/synth_model), helper and joiner
# on loopback over the TCP fabric, one thread each; COOP_FUSE_CLIENTS clients loop greedy requests
# of 48 tokens on each node. The figure is the tokens the helper samples per second (its own
# clients' + the joiner's), from both nodes' /metrics over COOP_FUSE_SECONDS after a warm-up.
# Never in CI (make bench). Noisy: 2 cores shared with builds and other work; the load average is
# printed with each pair.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
make -s -j2 build/strata build/tools/synth_model >/dev/null || exit 1
SERVE_MODEL=${COOP_FUSE_MODEL:-build/bench-models/stories110m-q8_0.gguf}
if [ ! -f "$SERVE_MODEL" ]; then
    mkdir -p "$(dirname "$SERVE_MODEL")"
    build/tools/synth_model --shape stories110M --type q8_0 --seed 1 -o "$SERVE_MODEL" >/dev/null || exit 1
fi
KS=${COOP_FUSE_KS:-3 6 9}
CLIENTS=${COOP_FUSE_CLIENTS:-4}
SECS=${COOP_FUSE_SECONDS:-10}
W=$(mktemp -d /tmp/coop_fuse.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
OPTS=(--max-batch $((2 * CLIENTS)) --ctx 512 --step-tokens 64 --fabric tcp --key-file "$W/key")

# measure K FUSE: prints "own remote fused% per_cpu": tokens/s the helper sampled for its own
# clients and for the joiner's, the share of remote steps fused, tokens per CPU-second of the
# helper's compute thread (what contention for the 2 cores does not change as much)
measure() {
    local k=$1 fuse=$2 fp i
    fp=$(free_port)
    serve_start "h-$k-$fuse" "${OPTS[@]}" --listen "127.0.0.1:$fp" -v --coop-fuse "$fuse" || return 1
    local hurl=$SERVE_URL hpid=$SERVE_PID
    serve_start "j-$k-$fuse" "${OPTS[@]}" --peers "127.0.0.1:$fp" -v --resident-layers "$k" || return 1
    local jurl=$SERVE_URL jpid=$SERVE_PID jlog=$SERVE_LOG
    for ((i = 0; i < 100; i++)); do
        grep -q "coop: helper .* connected" "$jlog" && break
        sleep 0.1
    done
    python3 - "$hurl" "$jurl" "$CLIENTS" "$SECS" "$hpid" <<'PY'
import json, os, sys, threading, time, urllib.request
hurl, jurl, clients, secs, hpid = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
stop = threading.Event()

def loop(url, i):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0,
                       "ignore_eos": True, "seed": i}).encode()
    while not stop.is_set():
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=120).read()
        except Exception:  # noqa: BLE001 - the figure shows it
            time.sleep(0.1)

def cpu_s(pid):  # user + system seconds of each of the helper's threads
    t = {}
    for tid in os.listdir("/proc/%s/task" % pid):
        f = open("/proc/%s/task/%s/stat" % (pid, tid)).read().rsplit(")", 1)[1].split()
        t[tid] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return t

def metrics(url):
    m = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        p = line.split()
        if len(p) == 2 and not line.startswith("#"):
            m[p[0]] = float(p[1])
    return m

th = [threading.Thread(target=loop, args=(u, i), daemon=True) for u in (hurl, jurl) for i in range(clients)]
for t in th:
    t.start()
time.sleep(3)  # warm-up: every client has a request running
h0, j0, t0, c0 = metrics(hurl), metrics(jurl), time.time(), cpu_s(hpid)
time.sleep(secs)
h1, j1, t1, c1 = metrics(hurl), metrics(jurl), time.time(), cpu_s(hpid)
stop.set()
d = lambda a, b, k: b.get(k, 0) - a.get(k, 0)
own = d(h0, h1, "strata_generation_tokens_total") / (t1 - t0)
rem = d(j0, j1, "strata_generation_tokens_total") / (t1 - t0)
served = d(h0, h1, "strata_coop_served_steps_total")
fused = d(h0, h1, "strata_coop_fused_steps_total")
# the compute thread: the one that ran the most in the window
busy = max(c1[t] - c0.get(t, 0) for t in c1)
per_cpu = (own + rem) * (t1 - t0) / busy if busy > 0 else 0
late = d(h0, h1, "strata_coop_fused_late_layers_total")
print("late layers per fused step: %.2f, steps %d/%d" % (late / fused if fused else 0, fused, served), file=sys.stderr)
print("%.1f %.1f %.0f %.1f" % (own, rem, 100 * fused / served if served else 0, per_cpu))
PY
    SERVE_PID=$jpid serve_stop
    SERVE_PID=$hpid serve_stop
}

echo "coop_fuse: $(basename "$SERVE_MODEL"), helper + joiner on loopback, 1 thread each, $CLIENTS clients on each node, ${SECS} s windows"
for k in $KS; do
    read -r on_own on_rem on_share on_cpu <<<"$(measure "$k" on)"
    load_on=$(cut -d' ' -f1 /proc/loadavg)
    read -r off_own off_rem off_share off_cpu <<<"$(measure "$k" off)"
    load_off=$(cut -d' ' -f1 /proc/loadavg)
    awk -v k="$k" -v a="$on_own" -v b="$on_rem" -v s="$on_share" -v c="$off_own" -v d="$off_rem" \
        -v pa="$on_cpu" -v pb="$off_cpu" -v la="$load_on" -v lb="$load_off" 'BEGIN {
        on = a + b; off = c + d; r = 0; rc = 0
        if (off > 0) r = on / off
        if (pb > 0) rc = pa / pb
        printf "  k = %2d of 12: fused %.1f tok/s (own %.1f + joiner %.1f, %d%% of its steps fused) vs apart %.1f (own %.1f + joiner %.1f): %.2fx; per compute-thread CPU-second %.0f vs %.0f tokens: %.2fx (load %s / %s)\n", k, on, a, b, s, off, c, d, r, pa, pb, rc, la, lb }'
done
exit $fail
