#!/bin/bash
# strata serve on loopback with the tiny model: endpoints, greedy output identical to
# `strata generate --temp 0` (plain and streamed), chat, stop strings, seeded sampling, every kind
# of bad input answered in OpenAI's error shape while serving goes on, and /metrics counters that
# add up to what the test sent. Then a server with an API key (401s) and a clean SIGTERM exit.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_api.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "serve_api: cannot convert the test model"; exit 1; }

serve_start api --max-conns 8 --timeout-ms 1000 --max-batch 8 || { not_ok "serve_api: start"; exit 1; }
python3 tests/lib/serve_checks.py api "$SERVE_URL" "$SERVE_PID" || fail=1
serve_stop

# curl, plain and streamed (-N), against `strata generate --temp 0`
serve_start curl || { not_ok "serve_api: start"; exit 1; }
"$STRATA" generate -m "$SERVE_MODEL" -p "Once upon a time" -n 30 --temp 0 --threads 1 2>/dev/null >"$W/gen"
curl -s "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":30,"temperature":0}' >"$W/plain"
curl -sN "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":30,"temperature":0,"stream":true}' >"$W/stream"
python3 - "$W" <<'PY' && ok "curl: completion and -N stream == strata generate --temp 0" || not_ok "curl: output differs from generate"
import json, sys
w = sys.argv[1]
gen = open(f"{w}/gen", "rb").read().decode()
want = gen[len("Once upon a time"):-1]
plain = json.load(open(f"{w}/plain"))["choices"][0]["text"]
events = [b[6:] for b in open(f"{w}/stream").read().split("\n\n") if b.startswith("data: ")]
assert events[-1] == "[DONE]", events[-1]
streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
assert plain == want and streamed == want, (plain, streamed, want)
PY
serve_stop

serve_start key --api-key sk-strata-test || { not_ok "serve_api: start with key"; exit 1; }
code=$(curl -s -o "$W/r" -w '%{http_code}' "$SERVE_URL/v1/models")
[ "$code" = 401 ] && grep -q '"error":{"message":"You didn' "$W/r" &&
    ok "api key: missing key -> 401 in OpenAI's shape" || not_ok "api key: missing key gave $code $(cat "$W/r")"
code=$(curl -s -o "$W/r" -w '%{http_code}' -H 'Authorization: Bearer nope' "$SERVE_URL/v1/completions" -d '{"prompt":"x"}')
[ "$code" = 401 ] && grep -q 'Incorrect API key' "$W/r" &&
    ok "api key: wrong key -> 401" || not_ok "api key: wrong key gave $code $(cat "$W/r")"
code=$(curl -s -o "$W/r" -w '%{http_code}' -H 'Authorization: Bearer sk-strata-test' "$SERVE_URL/v1/completions" -d '{"prompt":"Once","max_tokens":4}')
[ "$code" = 200 ] && ok "api key: right key -> 200" || not_ok "api key: right key gave $code $(cat "$W/r")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$SERVE_URL/health")
[ "$code" = 200 ] && ok "api key: /health stays open" || not_ok "api key: /health gave $code"
serve_stop
grep -q "stopped" "$SERVE_LOG" && ok "SIGTERM: clean stop" || not_ok "SIGTERM: no clean stop"
exit $fail
