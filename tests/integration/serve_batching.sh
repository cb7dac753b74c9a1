#!/bin/bash
# Continuous batching with the tiny model: 20 concurrent clients with different prompts and
# lengths (some streaming) each get exactly what `strata generate --temp 0` gives for their prompt
# alone; then the same through a KV pool of 10 blocks x 16 positions, which forces preemption and
# recomputation; then a client that disconnects mid-stream cancels its request and its blocks are
# freed at once (visible in /metrics). --test-step-delay-us slows steps so requests overlap.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_batching.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "serve_batching: cannot convert the test model"; exit 1; }

serve_start concurrent --max-batch 16 --step-tokens 64 --test-step-delay-us 300 ||
    { not_ok "serve_batching: start"; exit 1; }
python3 tests/lib/serve_checks.py concurrent "$SERVE_URL" || fail=1
serve_stop

serve_start preempt --max-batch 16 --step-tokens 64 --kv-blocks 10 --test-step-delay-us 300 ||
    { not_ok "serve_batching: start with a tiny KV pool"; exit 1; }
python3 tests/lib/serve_checks.py preempt "$SERVE_URL" || fail=1
serve_stop

serve_start cancel --test-step-delay-us 3000 || { not_ok "serve_batching: start"; exit 1; }
python3 tests/lib/serve_checks.py cancel "$SERVE_URL" || fail=1
serve_stop
exit $fail
