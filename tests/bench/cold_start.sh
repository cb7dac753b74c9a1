#!/bin/bash
# cold_start: how long `strata serve` takes from its start to /health 200 and to the first token,
# and how much of that is after the last layer became resident (the server's own start-up, which
# should be nothing but the weights). For stories260K (converted from ../shared), and the
# stories110M (Q8_0) and TinyLlama (Q4_0) shapes with random weights (tests/tools/synth_model,
# generated once into build/bench-models/). Each model is started COLD_RUNS times with an empty
# --state-dir (cold: no cached step model) and then COLD_RUNS times again with the state the
# first start left (warm: the cached step model, once idle calibration wrote one); medians.
#   COLD_MODELS="stories260K stories110M tinyllama"  COLD_RUNS=3  STRATA=build/strata
#   COLD_ARGS: more serve arguments (the old binary: COLD_ARGS= COLD_STATE=0, no --state-dir)
# The page cache is warm (the file was read just before): the figures are the server's, not the
# disk's. Noisy on a shared machine: run it on a quiet one, and say the load next to figures.
set -u
cd "$(dirname "$0")/../.."
STRATA=${STRATA:-build/strata}
SYNTH=${SYNTH:-build/tools/synth_model}
RUNS=${COLD_RUNS:-3}
STATE=${COLD_STATE:-1}
W=$(mktemp -d /tmp/cold_start.XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p build/bench-models

model_path() {
    case $1 in
    stories260K)
        local p=build/bench-models/stories260K.gguf
        [ -f $p ] || "$STRATA" convert --tokenizer ../shared/models/tok512.bin \
            ../shared/models/stories260K.bin $p >/dev/null 2>&1
        echo $p ;;
    stories110M | tinyllama)
        local t=q8_0
        [ "$1" = tinyllama ] && t=q4_0
        local p=build/bench-models/$1-$t.gguf
        [ -f $p ] || "$SYNTH" --shape "$1" --type $t --seed 1 \
            --tokenizer ../shared/models/tokenizer.bin -o $p >/dev/null 2>&1
        echo $p ;;
    esac
}

echo "cold_start: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) ($(uname -n))"
for name in ${COLD_MODELS:-stories260K stories110M tinyllama}; do
    m=$(model_path "$name")
    [ -f "$m" ] || { echo "cold_start: no $name model ($m)"; continue; }
    cat "$m" >/dev/null # the page cache
    rm -rf "$W/state" && mkdir -p "$W/state"
    python3 - "$STRATA" "$m" "$RUNS" "$W" "$STATE" ${COLD_ARGS:-} <<'PY'
import json, os, re, signal, socket, statistics, subprocess, sys, time, urllib.request

strata, model, runs, w, state = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
extra = sys.argv[6:]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def uptime():
    return float(open("/proc/uptime").read().split()[0])


def start(tag):
    port = free_port()
    log = os.path.join(w, "%s.log" % tag)
    args = [strata, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-v"] + extra
    if state == "1":
        args += ["--state-dir", os.path.join(w, "state")]
    t0, up0 = time.time(), uptime()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = "http://127.0.0.1:%d" % port
    ready = None
    while time.time() - t0 < 600 and p.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    ready = time.time() - t0
                    break
        except Exception:
            pass
        time.sleep(0.01)
    first = None
    if ready is not None:
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}).encode()
        rq = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=600) as r:
            r.read()
        first = time.time() - t0
    text = open(log).read()
    spans = re.findall(r"\[\s*([\d.]+)\] loader: span (\d+)/(\d+) resident", text)
    resident = float(spans[-1][0]) - up0 if spans else None
    prior = re.search(r"strata serve: step model: ([^\n]*)", text)
    return p, log, ready, first, resident, prior.group(1) if prior else "-"


def stop(p, wait_idle):
    if wait_idle:  # let idle calibration finish (it writes the cache)
        t = time.time()
        while time.time() - t < wait_idle:
            time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else float("nan")


name = os.path.basename(model)
for phase in ("cold", "warm"):
    rows = []
    for i in range(runs):
        if phase == "cold" and state == "1":
            for f in os.listdir(os.path.join(w, "state")):
                os.unlink(os.path.join(w, "state", f))
        p, log, ready, first, resident, prior = start("%s-%s-%d" % (name, phase, i))
        cal = 0
        if phase == "cold" and i == runs - 1 and state == "1":
            cal = 1  # the last cold run stays up until idle calibration saved the model
            t = time.time()
            while time.time() - t < 900 and "saved to" not in open(log).read():
                time.sleep(0.5)
        stop(p, 0)
        rows.append((ready, first, resident, prior))
    r, f, res = med([x[0] for x in rows]), med([x[1] for x in rows]), med([x[2] for x in rows])
    print("%-24s %-4s health 200 %7.2f s, first token %7.2f s, last layer resident %6.2f s "
          "(ready %+.2f s after it); prior: %s" % (name, phase, r, f, res, r - res, rows[-1][3]))
    if state != "1":
        break
PY
done
