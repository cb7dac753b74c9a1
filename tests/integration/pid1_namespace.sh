#!/bin/bash
# pid1_namespace: the server's PID-1 duties without a VM. In a new PID namespace (unshare, root)
# `strata serve` is PID 1; /health must say pid 1 and one process; SIGTERM must shut it down
# cleanly, ending with reboot(RB_POWER_OFF), which the kernel turns into the namespace's init being
# killed by SIGINT (exit status 130); a fatal start-up error (a model that is not GGUF) must print
# the reason and halt the same way, and never just exit.
set -u
cd "$(dirname "$0")/../.."
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
MODEL=${BOOT_MODEL:-build/models/stories260K.gguf}
[ "$(id -u)" = 0 ] && command -v unshare >/dev/null || { echo "skip - pid1 namespace: needs root and unshare"; exit 0; }
if [ ! -f "$MODEL" ]; then
    mkdir -p build/models
    build/strata convert --tokenizer ../shared/models/tok512.bin ../shared/models/stories260K.bin "$MODEL" >/dev/null 2>&1 ||
        { nok "pid1 namespace model" "cannot convert stories260K"; exit 1; }
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
W=build/test-pid1
mkdir -p $W
unshare --pid --fork --mount-proc build/strata serve -m "$MODEL" --host 127.0.0.1 --port "$port" \
    --max-batch 2 --step-tokens 16 >$W/serve.log 2>&1 &
pid=$!
code=""
for _ in $(seq 1 300); do
    code=$(curl -s -o $W/health -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health" || true)
    [ "$code" = 200 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
if [ "$code" = 200 ] && grep -q '"pid":1,' $W/health && grep -q '"processes":1,' $W/health; then
    ok "pid1 namespace: /health reports pid 1, 1 process"
else
    nok "pid1 namespace: /health reports pid 1, 1 process" "code ${code:-none}: $(cat $W/health 2>/dev/null) $(tail -n 3 $W/serve.log)"
fi
# unshare blocks SIGTERM itself: signal its child, the namespace's PID 1, and give it 30 s.
child=$(pgrep -P $pid | head -n 1)
[ -n "$child" ] && kill -TERM "$child"
for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $pid 2>/dev/null; then
    [ -n "$child" ] && kill -KILL "$child"
    kill -KILL $pid 2>/dev/null
fi
wait $pid
rc=$?
if [ $rc = 130 ] && grep -q "strata: SIGTERM: shutting down" $W/serve.log && grep -q "shutdown complete, powering off" $W/serve.log; then
    ok "pid1 namespace: SIGTERM shuts down cleanly and powers off"
else
    nok "pid1 namespace: SIGTERM shuts down cleanly and powers off" "status $rc: $(tail -n 4 $W/serve.log | tr '\n' '|')"
fi

timeout -s KILL 60 unshare --pid --fork --mount-proc build/strata serve -m /proc/self/exe --port 0 >$W/fatal.log 2>&1
rc=$?
if [ $rc = 130 ] && grep -q "strata: fatal: serve: .*not a GGUF file" $W/fatal.log && grep -q "strata: halting (strata.on_error=" $W/fatal.log; then
    ok "pid1 namespace: a fatal error prints the reason and halts"
else
    nok "pid1 namespace: a fatal error prints the reason and halts" "status $rc: $(tail -n 3 $W/fatal.log | tr '\n' '|')"
fi
exit $fail
