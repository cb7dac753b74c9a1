#!/bin/bash
# Pipelined coop steps (--coop-pipeline, docs/cluster.md) where they can pay: a helper and a joiner
# holding half the layers (stories110M shape Q8_0, k = 6 of 12), both on loopback, one thread each,
# a burst of N long prompts (~P words) sent to the joiner at once, prefilled in 64-token chunks.
# Prints, for the pipeline off and on (one helper + joiner pair each, in the same run): the
# burst's wall time, TTFT P50/P99 and the steps pipelined; the texts must match. Never in CI; noisy
# on shared cores (report `uptime`).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
SERVE_MODEL=${COOP_PIPE_MODEL:-build/bench-models/stories110m-q8_0.gguf}
[ -f "$SERVE_MODEL" ] || { mkdir -p build/bench-models &&
    build/tools/synth_model --shape stories110M --type q8_0 --seed 1 -o "$SERVE_MODEL" >/dev/null; } || exit 1
N=${COOP_PIPE_BURST:-4}
P=${COOP_PIPE_WORDS:-60}
K=${COOP_PIPE_K:-6}
W=$(mktemp -d /tmp/coop_pipe.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
OPTS=(--max-batch "$N" --ctx 1024 --step-tokens 64 --fabric tcp --key-file "$W/key" -v)
echo "coop_pipeline: $(basename "$SERVE_MODEL"), joiner at k = $K, burst of $N prompts of ~$P words x 8 tokens; $(uptime | sed 's/.*load/load/')"
for pipe in off on; do
    fp=$(free_port)
    serve_start "h-$pipe" "${OPTS[@]}" --listen "127.0.0.1:$fp" || exit 1
    serve_start "j-$pipe" "${OPTS[@]}" --peers "127.0.0.1:$fp" --resident-layers "$K" --coop-pipeline "$pipe" || exit 1
    jurl=$SERVE_URL jlog=$SERVE_LOG
    for ((i = 0; i < 100; i++)); do grep -q "coop: helper .* connected" "$jlog" && break; sleep 0.1; done
    python3 - "$jurl" "$N" "$P" "$pipe" "$W" <<'PY'
import json, sys, threading, time, urllib.request
sys.path.insert(0, "tests/lib")
url, n, words, pipe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
filler = "and they played in the sun all day long with a big red ball then the cat came".split()
prompts = [" ".join((["Once upon a time"] + [filler[(j * (i + 3)) % len(filler)] for j in range(words)])) for i in range(n)]
ttft, texts = [None] * n, [None] * n
t0 = time.perf_counter()
def one(i):
    body = json.dumps({"prompt": prompts[i], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                if ttft[i] is None:
                    ttft[i] = time.perf_counter() - t0
                text += json.loads(line[6:])["choices"][0]["text"]
    texts[i] = text
th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in th]
[t.join() for t in th]
wall = time.perf_counter() - t0
t = sorted(ttft)
m = urllib.request.urlopen(url + "/metrics").read().decode().splitlines()
get = lambda k: next((l.split()[1] for l in m if l.startswith(k + " ")), "?")
print("  pipeline %-3s: burst %.2f s, TTFT P50 %.2f s P99 %.2f s; %s of %s remote steps pipelined"
      % (pipe, wall, t[len(t) // 2], t[-1], get("strata_coop_pipelined_steps_total"),
         get("strata_coop_remote_steps_total")))
open(sys.argv[5] + "/texts_" + pipe, "w").write(json.dumps(texts))
PY
    serve_cleanup
    SERVE_PIDS=()
done
cmp -s "$W/texts_off" "$W/texts_on" && echo "  texts: identical on and off" || echo "  texts differ between on and off!"
