#!/bin/bash
# Faults of cooperative execution (docs/cluster.md), two `strata serve` processes on loopback:
#   - a helper killed mid-request: the joiner's streamed request ends in an SSE error event after
#     text that is a prefix of the right answer, a plain one gets HTTP 500 naming the helper, and
#     new requests wait (the joiner waits for its own layers) instead of getting wrong text;
#   - a joiner without the cluster key is refused and never splits a step;
#   - activation messages with a wrong length, an unopened sequence, a step going backwards, a
#     bad CRC or token rows claiming a layer above 0 each get one clear log line at the helper and
#     close that peer, while the helper goes on serving; a well-formed one gets its token, as does
#     one sent as token ids; so does a KV request for a sequence the peer never opened (closed);
#   - a helper whose KV answers are wrong (another sequence, another layer, cut short): the joiner
#     refuses them with a log line naming the reason, recomputes, and its text stays exact; one
#     that refuses one sequence of a batched request: that one is recomputed, the rest come; a
#     helper that dies during a KV transfer fails the running requests with an error naming it.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/cluster_faults.XXXXXX)
trap 'serve_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
serve_model || { not_ok "cluster_faults: cannot convert the test model"; exit 1; }
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/otherkey"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() { curl -s "$1/metrics" | awk -v n="$2" '$1 == n {print $2}'; }
CHECKS="python3 tests/lib/cluster_checks.py"
wait_log() { # wait_log FILE PATTERN SECONDS
    local i
    for ((i = 0; i < $3 * 10; i++)); do grep -q "$2" "$1" && return 0; sleep 0.1; done
    return 1
}

FP=$(free_port)
serve_start helper --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v ||
    { not_ok "cluster_faults: start helper"; exit 1; }
HELPER_URL=$SERVE_URL HELPER_PID=$SERVE_PID HELPER_LOG=$SERVE_LOG

# 1. a joiner without the key
serve_start nokey --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/otherkey" -v \
    --resident-layers 2 || { not_ok "cluster_faults: start the keyless joiner"; exit 1; }
NOKEY_URL=$SERVE_URL NOKEY_LOG=$SERVE_LOG NOKEY_PID=$SERVE_PID
sleep 1.5
code=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$NOKEY_URL/v1/completions" \
    -d '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}')
if grep -q "peer 127.0.0.1:$FP: " "$NOKEY_LOG" && ! grep -q "coop: helper .* connected" "$NOKEY_LOG" &&
    ! grep -q "fabric: node 0: peer .* open" "$HELPER_LOG" && [ "$code" = 000 ] &&
    [ "$(metric "$HELPER_URL" strata_coop_served_steps_total)" = 0 ]; then
    ok "a joiner without the cluster key is refused ($(grep -m1 -o "peer 127.0.0.1:$FP: .*" "$NOKEY_LOG" | cut -c1-90)); its request waits, nothing split"
else
    not_ok "keyless joiner: code $code; log: $(grep -i fabric "$NOKEY_LOG" | tail -3)"
fi
kill -9 "$NOKEY_PID" 2>/dev/null

# 2. bad activation messages from a peer with the key
DIM=64
for mode in badlen badseq badstep badcrc badkvreq badtokens; do
    out=$(build/tools/coop_inject --key-file "$W/key" --peer "127.0.0.1:$FP" --dim $DIM --mode $mode 2>&1)
    rc=$?
    case $mode in
    badlen) pat="activations: .* bytes, .* need" ;;
    badseq) pat="sequence 77 was never opened" ;;
    badstep) pat="step 3 after step 5" ;;
    badcrc) pat="activations: CRC-32C" ;;
    badkvreq) pat="KV request for sequence 9, which it never opened" ;;
    badtokens) pat="activations: token rows for layer 1" ;;
    esac
    line=$(grep -m1 "coop: peer .*$pat" "$HELPER_LOG")
    if [ $rc = 0 ] && [ -n "$line" ]; then
        ok "activation message $mode: peer closed; helper log: ${line#*coop: }"
    else
        not_ok "activation message $mode: inject said '$out', no log line '$pat'"
    fi
done
out=$(build/tools/coop_inject --key-file "$W/key" --peer "127.0.0.1:$FP" --dim $DIM --mode good 2>&1) &&
    ok "a well-formed activation message gets its token ($out)" || not_ok "good activation message: $out"
out=$(build/tools/coop_inject --key-file "$W/key" --peer "127.0.0.1:$FP" --dim $DIM --mode tokens 2>&1) &&
    ok "a step sent as token ids (no embedding at the joiner) gets its token ($out)" ||
    not_ok "token-id step: $out"
txt=$(curl -s "$HELPER_URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}')
echo "$txt" | grep -q '"text"' && ok "the helper serves its own clients after the bad peers" ||
    not_ok "helper after bad peers: $txt"

# 3. the helper dies mid-request
serve_start joiner --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
    --resident-layers 2 --test-step-delay-us 20000 || { not_ok "cluster_faults: start joiner"; exit 1; }
JOINER_URL=$SERVE_URL JOINER_LOG=$SERVE_LOG JOINER_PID=$SERVE_PID
wait_log "$JOINER_LOG" "coop: helper .* connected" 5 || not_ok "the joiner never connected"
# the reference first: the same request to the helper alone
$CHECKS stream "$HELPER_URL" "$W/ref_stream" >/dev/null 2>&1
: >"$W/stream"
count() { grep -c '^data: {' "$W/stream"; }
$CHECKS stream "$JOINER_URL" "$W/stream" &
SP=$!
# the plain request starts once the stream runs, and the helper dies a few steps later: both are
# mid-flight (the plain one has 400 tokens to go, the stream 200)
for ((i = 0; i < 500; i++)); do [ "$(count)" -ge 1 ] && break; sleep 0.02; done
curl -s -o "$W/plain" -w '%{http_code}' "$JOINER_URL/v1/completions" \
    -d '{"prompt":"The little dog","max_tokens":400,"temperature":0,"ignore_eos":true}' >"$W/plain_code" &
CP=$!
n0=$(count)
for ((i = 0; i < 500; i++)); do [ "$(count)" -ge $((n0 + 6)) ] && break; sleep 0.02; done
kill -9 "$HELPER_PID"
wait "$SP" "$CP"
python3 - "$W/stream" "$W/ref_stream" >"$W/verdict" 2>&1 <<'PY'
import json, sys
def read(path):
    text, err = "", None
    for l in open(path).read().splitlines():
        if not l.startswith("data: {"):
            continue
        ev = json.loads(l[6:])
        if "error" in ev:
            err = ev["error"]["message"]
            break
        text += ev["choices"][0]["text"]
    return text, err
got, err = read(sys.argv[1])
ref, _ = read(sys.argv[2])
assert err, f"no error event after {len(got)} bytes"
assert ref.startswith(got), f"wrong text before the error: {got!r}"
assert 0 < len(got) < len(ref), (len(got), len(ref))
print(f"{len(got)} correct bytes, then the SSE error event: {err}")
PY
if [ $? = 0 ]; then ok "helper killed mid-stream: $(cat "$W/verdict")"; else not_ok "helper killed mid-stream: $(cat "$W/verdict")"; fi
pcode=$(cat "$W/plain_code")
if [ "$pcode" = 500 ] && grep -q "helper 127.0.0.1:$FP" "$W/plain"; then
    ok "helper killed mid-request: plain request -> 500 ($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$W/plain"))"
else
    not_ok "helper killed: plain request got $pcode $(head -c 300 "$W/plain")"
fi
curl -s -m 3 -o /dev/null -w '%{http_code}' "$JOINER_URL/v1/completions" \
    -d '{"prompt":"Once upon a time","max_tokens":5,"temperature":0}' >"$W/late_code" &
LP=$!
sleep 1.5
waiting=$(metric "$JOINER_URL" strata_num_requests_waiting)
wait $LP
code=$(cat "$W/late_code")
[ "$code" = 000 ] && grep -q "peer 0 (127.0.0.1:$FP) closed" "$JOINER_LOG" &&
    [ "$waiting" = 1 ] &&
    ok "after the helper died: a new request waits for the joiner's own layers (no answer in 3 s, strata_num_requests_waiting $waiting)" ||
    not_ok "after the helper died: a new request got $code ($waiting waiting)"
SERVE_PID=$JOINER_PID SERVE_LOG=$JOINER_LOG serve_stop

# 4. wrong KV answers: refused with a log line, recomputed, the text exact; a helper that refuses
#    one sequence of a batched request (status 1): that one recomputed, the rest transferred
for fault in seq layer short refuse; do
    FP=$(free_port)
    serve_start "kv-$fault-helper" --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v \
        --test-kv-fault $fault || { not_ok "KV fault $fault: start helper"; continue; }
    H_URL=$SERVE_URL H_PID=$SERVE_PID H_LOG=$SERVE_LOG
    serve_start "kv-$fault-joiner" --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
        --resident-schedule 0:1,10:3,30:5 --coop-kv transfer || { not_ok "KV fault $fault: start joiner"; continue; }
    J_URL=$SERVE_URL J_PID=$SERVE_PID J_LOG=$SERVE_LOG
    wait_log "$J_LOG" "coop: helper .* connected" 5 || not_ok "KV fault $fault: the joiner never connected"
    case $fault in
    seq) pat="a chunk for sequence [0-9]*, we asked for sequence" ;;
    layer) pat="a chunk for layer [0-9]*, we expect layer" ;;
    short) pat="coop kv: [0-9]* bytes, [0-9]* rows of kv_dim" ;;
    refuse) pat="the helper could not send it: test: the second sequence of a request" ;;
    esac
    out=$($CHECKS same "$H_URL" "$J_URL" 2>&1)
    rc=$?
    line=$(grep -m1 "KV of layers .* refused: .*$pat.*; recomputing it" "$J_LOG")
    fills=$(metric "$J_URL" strata_coop_fill_layers_total)
    moved=$(metric "$J_URL" strata_coop_kv_layers_total)
    # refuse: only the second sequence of each request is refused, the others come in the batch
    if [ $fault = refuse ]; then [ "${moved:-0}" -gt 0 ]; else [ "${moved:-1}" = 0 ]; fi
    moved_ok=$?
    if [ $rc = 0 ] && [ -n "$line" ] && [ "${fills:-0}" -gt 0 ] && [ $moved_ok = 0 ]; then
        ok "KV answer broken ($fault) refused and recomputed ($fills layer recomputes, $moved transferred), text exact ($out); joiner log: ${line#*coop: }"
    else
        not_ok "KV fault $fault: checks '$out', refused line '$line', recomputes $fills, transfers $moved"
    fi
    SERVE_PID=$J_PID SERVE_LOG=$J_LOG serve_stop
    SERVE_PID=$H_PID SERVE_LOG=$H_LOG serve_stop
done

# 3b. the helper dies with two pipelined steps in flight: three requests decoding and a long prompt
#     prefilling in 16-token chunks (a chunk goes out while the step before it is at the helper);
#     every one of them fails with an error naming the helper, the joiner logs the failed step
#     with the other still in flight
FP=$(free_port)
serve_start pipe-helper --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v ||
    { not_ok "pipelined: start helper"; exit 1; }
PH_PID=$SERVE_PID
serve_start pipe-joiner --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
    --resident-layers 2 --step-tokens 16 --coop-pipeline on --test-step-delay-us 20000 ||
    { not_ok "pipelined: start joiner"; exit 1; }
PJ_URL=$SERVE_URL PJ_PID=$SERVE_PID PJ_LOG=$SERVE_LOG
wait_log "$PJ_LOG" "coop: helper .* connected" 5 || not_ok "pipelined: the joiner never connected"
PIDS=()
for i in 0 1 2; do
    curl -s -m 30 -o "$W/pipe$i" -w '%{http_code}' "$PJ_URL/v1/completions" \
        -d "{\"prompt\":\"Once upon a time $i\",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true}" \
        >"$W/pipe${i}_code" &
    PIDS+=($!)
done
for ((i = 0; i < 250; i++)); do [ "$(metric "$PJ_URL" strata_coop_remote_steps_total)" -ge 5 ] && break; sleep 0.02; done
long=$($CHECKS prompt --long 110 --n 1)
p0=$(metric "$PJ_URL" strata_prompt_tokens_total)
curl -s -m 30 -o "$W/pipe3" -w '%{http_code}' "$PJ_URL/v1/completions" \
    -d "{\"prompt\":$long,\"max_tokens\":20,\"temperature\":0}" >"$W/pipe3_code" &
PIDS+=($!)
# the long prompt admitted (its prefill under way), then two more steps pipelined
for ((i = 0; i < 250; i++)); do [ "$(metric "$PJ_URL" strata_prompt_tokens_total)" -gt "$p0" ] && break; sleep 0.02; done
# the helper frozen (SIGSTOP) answers nothing more: the joiner pipelines a step behind the one at
# the helper and waits with two in flight; once the count has moved since the stop and then stood
# still for half a second, the helper is killed (timing alone left one in flight on a slow host)
p1=$(metric "$PJ_URL" strata_coop_pipelined_steps_total)
kill -STOP "$PH_PID"
last=-1 still=0
for ((i = 0; i < 200 && still < 5; i++)); do
    sleep 0.1
    now=$(metric "$PJ_URL" strata_coop_pipelined_steps_total)
    if [ "$now" = "$last" ] && [ "$now" -gt "$p1" ]; then still=$((still + 1)); else still=0; fi
    last=$now
done
piped=$(metric "$PJ_URL" strata_coop_pipelined_steps_total)
kill -9 "$PH_PID"
wait "${PIDS[@]}"
bad=""
for i in 0 1 2 3; do
    c=$(cat "$W/pipe${i}_code")
    m=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$W/pipe$i" 2>/dev/null)
    { [ "$c" = 500 ] && echo "$m" | grep -q "helper 127.0.0.1:$FP"; } || bad="$bad request $i: $c $(head -c 200 "$W/pipe$i");"
done
if [ -z "$bad" ] && grep -q "pipelined step .* failed with 1 more in flight" "$PJ_LOG"; then
    ok "helper killed with two pipelined steps in flight ($piped pipelined before): 4 requests -> 500 ($m); joiner: $(grep -o "pipelined step .* failed with 1 more in flight" "$PJ_LOG" | head -1)"
else
    not_ok "helper killed with two steps in flight ($piped pipelined):$bad $(grep "pipelined step" "$PJ_LOG" | head -2)"
fi
SERVE_PID=$PJ_PID SERVE_LOG=$PJ_LOG serve_stop

# 5. the helper dies during a KV transfer (k 1 -> 3 of 5: layers [3, 5) went with it)
FP=$(free_port)
serve_start kv-die-helper --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v \
    --test-kv-fault die || { not_ok "KV die: start helper"; exit 1; }
H_PID=$SERVE_PID H_LOG=$SERVE_LOG
serve_start kv-die-joiner --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
    --resident-schedule 0:1,10:3 --coop-kv transfer || { not_ok "KV die: start joiner"; exit 1; }
J_URL=$SERVE_URL J_PID=$SERVE_PID J_LOG=$SERVE_LOG
wait_log "$J_LOG" "coop: helper .* connected" 5 || not_ok "KV die: the joiner never connected"
code=$(curl -s -m 60 -o "$W/kvdie" -w '%{http_code}' "$J_URL/v1/completions" \
    -d '{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"ignore_eos":true}')
msg=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"])' "$W/kvdie" 2>/dev/null)
if [ "$code" = 500 ] && echo "$msg" | grep -q "helper 127.0.0.1:$FP failed during the KV transfer of layers \[1, 3)" &&
    grep -q "test: exiting during the KV transfer" "$H_LOG"; then
    ok "helper died during a KV transfer: the request -> 500 ($msg)"
else
    not_ok "helper died during a KV transfer: $code $(head -c 300 "$W/kvdie")"
fi
SERVE_PID=$J_PID SERVE_LOG=$J_LOG serve_stop
exit $fail
