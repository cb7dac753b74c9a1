#!/bin/bash
# What real clients do that the other serve scenarios do not: send chunked request bodies (curl
# with -H 'Transfer-Encoding: chunked', Python requests with a generator body, http.client with
# encode_chunked) and get exactly `strata generate --temp 0`'s completion; and stop reading a
# stream: a client with a 1 KiB receive buffer reads the first event of a long stream and then
# never reads again (socket open). Others are served meanwhile; --timeout-ms after the client
# stops acknowledging, the request is cancelled and its KV blocks freed (/metrics), and the
# server goes on. Timing sets timeouts only; nothing passes or fails on speed.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_clients.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "serve_clients: cannot convert the test model"; exit 1; }

serve_start chunked || { not_ok "serve_clients: start"; exit 1; }
"$STRATA" generate -m "$SERVE_MODEL" -p "Once upon a time" -n 30 --temp 0 --threads 1 2>/dev/null >"$W/gen"
printf '{"prompt":"Once upon a time","max_tokens":30,"temperature":0}' >"$W/body.json"
curl -sv "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' \
    -H 'Transfer-Encoding: chunked' --data-binary @"$W/body.json" >"$W/plain" 2>"$W/plain.trace"
curl -sNv "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' \
    -H 'Transfer-Encoding: chunked' --data-binary \
    '{"prompt":"Once upon a time","max_tokens":30,"temperature":0,"stream":true}' \
    >"$W/stream" 2>"$W/stream.trace"
python3 - "$W" <<'PY' && ok "curl: chunked request body (plain and -N stream) == strata generate --temp 0" || not_ok "curl: chunked request body"
import json, sys
w = sys.argv[1]
for t in ("plain", "stream"):
    trace = open(f"{w}/{t}.trace").read()
    assert "> Transfer-Encoding: chunked" in trace and "> Content-Length" not in trace, trace
gen = open(f"{w}/gen", "rb").read().decode()
want = gen[len("Once upon a time"):-1]
plain = json.load(open(f"{w}/plain"))["choices"][0]["text"]
events = [b[6:] for b in open(f"{w}/stream").read().split("\n\n") if b.startswith("data: ")]
assert events[-1] == "[DONE]", events[-1]
streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
assert plain == want and streamed == want, (plain, streamed, want)
PY
python3 tests/lib/serve_checks.py chunked "$SERVE_URL" || fail=1
serve_stop

# 10 ms per step: the 480-token stream lasts several seconds, longer than --timeout-ms
serve_start stall --timeout-ms 2000 --test-step-delay-us 10000 || { not_ok "serve_clients: start"; exit 1; }
python3 tests/lib/serve_checks.py stall "$SERVE_URL" 2000 || fail=1
serve_stop
grep -q "stopped reading" "$SERVE_LOG" && ok "stall: the server logged why it dropped the client" ||
    not_ok "stall: no log line for the dropped client"
exit $fail
