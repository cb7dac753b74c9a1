#!/bin/bash
# The step model across restarts (serving/sched/step_prior.h, step_cache.h), with the tiny model:
# a first start serves at once from a default prior and, once idle, calibrates and caches its
# step model in its state directory; a restart starts from the cache and says so (and runs no
# calibration); a cache damaged by one byte, or re-signed for other hardware, is passed over
# with exactly one line and the server starts from the default as if there were none; with
# --state-dir off nothing is read or written. Every server answers exactly as `strata generate`.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_step_cache.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "serve_step_cache: cannot convert the test model"; exit 1; }
"$STRATA" generate -m "$SERVE_MODEL" -p "Once upon a time" -n 24 --temp 0 --threads 1 2>/dev/null >"$W/gen"

# exact greedy answer from the running server
answer() {
    curl -s "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$W/answer"
    python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
want = open(f"{w}/gen", "rb").read().decode()[len("Once upon a time"):-1]
got = json.load(open(f"{w}/answer"))["choices"][0]["text"]
sys.exit(0 if got == want else 1)
PY
}

# wait_log PATTERN: until the server's log has it (10 s at most)
wait_log() {
    local i
    for ((i = 0; i < 100; i++)); do
        grep -q "$1" "$SERVE_LOG" && return 0
        sleep 0.1
    done
    return 1
}

cache_lines() { grep -c "step model cache" "$SERVE_LOG"; }

serve_start first -v || { not_ok "serve_step_cache: start"; exit 1; }
grep -q "strata serve: step model: prior .* (a default from .* MiB of weights read at" "$SERVE_LOG" &&
    ok "first start: serves from a default prior (nothing timed before ready)" ||
    not_ok "first start: no default prior line: $(grep 'step model' "$SERVE_LOG")"
answer && ok "first start: exact answer while the model is uncertain" || not_ok "first start: answer differs"
if wait_log "serve: step model: saved to $W/state/strata/step-model-"; then
    ok "first start: calibrated while idle and cached ($(grep -o 'calibrated while idle: [^)]*' "$SERVE_LOG"))"
else
    not_ok "first start: no cache written: $(grep 'step model' "$SERVE_LOG" | tail -n 3)"
fi
serve_stop
CACHE=$(ls "$W"/state/strata/step-model-*.txt 2>/dev/null | head -n 1)
[ -f "$CACHE" ] || { not_ok "serve_step_cache: no cache file in $W/state/strata"; exit 1; }

serve_start restart -v || { not_ok "serve_step_cache: restart"; exit 1; }
grep -q "strata serve: step model: [0-9.]* us/token + .*(cached in $CACHE, fitted on this hardware" "$SERVE_LOG" &&
    ok "restart: starts from the cached step model and says so" ||
    not_ok "restart: $(grep 'step model' "$SERVE_LOG")"
answer && ok "restart: exact answer" || not_ok "restart: answer differs"
sleep 1.5 # idle: a calibrated model runs no calibration
grep -q "calibrated while idle" "$SERVE_LOG" && not_ok "restart: calibrated again" ||
    ok "restart: no calibration"
serve_stop

# one byte damaged (a digit of a, so the text still reads well): one line, the default prior
cp "$CACHE" "$W/good"
python3 - "$CACHE" <<'PY'
import sys
p = sys.argv[1]
s = bytearray(open(p, "rb").read())
i = s.index(b"\na ") + 3
s[i] = ord("7") if s[i] != ord("7") else ord("6")
open(p, "wb").write(s)
PY
serve_start corrupt -v || { not_ok "serve_step_cache: start with a damaged cache"; exit 1; }
n=$(cache_lines)
[ "$n" = 1 ] && grep -q "step model cache not used: $CACHE: corrupt: checksum mismatch" "$SERVE_LOG" &&
    grep -q "step model: prior .*(a default from" "$SERVE_LOG" &&
    ok "damaged cache: ignored with one line, default prior" ||
    not_ok "damaged cache: $n lines: $(grep 'step model' "$SERVE_LOG")"
answer && ok "damaged cache: exact answer" || not_ok "damaged cache: answer differs"
serve_stop

# the good file re-signed for other hardware (the checksum right: foreign, not corrupt)
python3 - "$W/good" "$CACHE" <<'PY'
import hashlib, sys
lines = open(sys.argv[1]).read().split("\n")
lines = [("hardware cpu Some Other CPU (avx512), 64 threads, kv f16" if l.startswith("hardware ") else l)
         for l in lines if l and not l.startswith("check ")]
body = "".join(l + "\n" for l in lines)
open(sys.argv[2], "w").write(body + "check " + hashlib.blake2b(body.encode(), digest_size=16).hexdigest() + "\n")
PY
serve_start foreign -v || { not_ok "serve_step_cache: start with a foreign cache"; exit 1; }
n=$(cache_lines)
[ "$n" = 1 ] && grep -q "step model cache not used: $CACHE: foreign: made on cpu Some Other CPU (avx512), 64 threads" "$SERVE_LOG" &&
    grep -q "step model: prior .*(a default from" "$SERVE_LOG" &&
    ok "foreign cache: ignored with one line, default prior" ||
    not_ok "foreign cache: $n lines: $(grep 'step model' "$SERVE_LOG")"
answer && ok "foreign cache: exact answer" || not_ok "foreign cache: answer differs"
serve_stop

# --state-dir off: nothing read (the good cache is back) or written
cp "$W/good" "$CACHE"
before=$(ls -l --time-style=+%s.%N "$W/state/strata")
serve_start off -v --state-dir off || { not_ok "serve_step_cache: start with --state-dir off"; exit 1; }
wait_log "calibrated while idle" >/dev/null
grep -q "step model: prior .*(a default from" "$SERVE_LOG" && ! grep -q "saved to\|step model cache" "$SERVE_LOG" &&
    [ "$before" = "$(ls -l --time-style=+%s.%N "$W/state/strata")" ] &&
    ok "--state-dir off: no cache read or written" || not_ok "--state-dir off: $(grep 'step model' "$SERVE_LOG")"
serve_stop
exit $fail
