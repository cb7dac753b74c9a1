#!/bin/bash
# tests/tools/loadgen's closed loop (--clients, the request set of tests/bench/vs_llama_server.sh)
# against the tiny model: 7 requests of 8 random prompt tokens, 3 in flight at most, each with 5
# output tokens forced by "ignore_eos", streamed: every one succeeds with exactly 5 tokens (35 in
# all); without a trace the lengths are required (usage, status 2). ~2 s.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_loadgen.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
LOADGEN=build/tools/loadgen
[ -x "$LOADGEN" ] || { not_ok "serve_loadgen: $LOADGEN not built"; exit 1; }
serve_model || { not_ok "serve_loadgen: cannot convert the test model"; exit 1; }

serve_start closed --max-batch 4 --test-step-delay-us 2000 || { not_ok "serve_loadgen: start"; exit 1; }
"$LOADGEN" --url "$SERVE_URL" --clients 3 --requests 7 --prompt-len 8 --gen 5 --vocab 512 \
    --no-slo --seed 3 --label closed >"$W/out" 2>"$W/err"
rc=$?
res=$(grep '^RESULT' "$W/out")
if [ $rc -eq 0 ] && [[ "$res" == *" ok=7 failed=0 "* ]] && [[ "$res" == *" tokens=35" ]]; then
    ok "serve_loadgen: closed loop, 3 clients, 7 requests of exactly 5 tokens (EOS ignored)"
else
    not_ok "serve_loadgen: closed loop: status $rc, '$res' $(cat "$W/err")"
fi
serve_stop

"$LOADGEN" --url "$SERVE_URL" --clients 3 >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then
    ok "serve_loadgen: --clients without a trace needs --prompt-len and --gen (status 2)"
else
    not_ok "serve_loadgen: --clients without lengths: status $rc, want 2"
fi
exit $fail
