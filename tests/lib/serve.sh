# serve.sh: helpers for the `strata serve` integration scenarios (sourced by
# tests/integration/serve_*.sh and tests/bench/serve_trace.sh).
#
# serve_model            converts ../shared/models/stories260K.bin once into $SERVE_MODEL
# serve_llama2_model     writes a tiny random model with the Llama 2 vocabulary, once
# serve_start NAME ARGS  starts `strata serve` on 127.0.0.1 on a free port (--port 0) with ARGS,
#                        waits for /health 200 (15 s at most); sets SERVE_PID, SERVE_PORT, SERVE_URL;
#                        its state (the step-model cache) in $W/state, shared by the scenario's
#                        servers (a restart finds what the last one cached), never in ~/.cache
# serve_stop             SIGTERM, then waits; fails the scenario if the exit status is not 0
# serve_cleanup          (EXIT trap) kills what serve_start started
STRATA=${STRATA:-build/strata}
SHARED=${STRATA_SHARED:-../shared}
SERVE_MODEL=${SERVE_MODEL:-build/test-models/stories260K.gguf}
SERVE_PIDS=()
fail=0

ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; fail=1; }

serve_model() {
    [ -f "$SERVE_MODEL" ] && return 0
    mkdir -p "$(dirname "$SERVE_MODEL")"
    "$STRATA" convert --tokenizer "$SHARED/models/tok512.bin" "$SHARED/models/stories260K.bin" \
        "$SERVE_MODEL" >/dev/null 2>&1
}

# serve_llama2_model: a random-weight model with the real Llama 2 vocabulary (32000 tokens, from
# ../shared/models/tokenizer.bin) in $SERVE_LLAMA2_MODEL, once
SERVE_LLAMA2_MODEL=${SERVE_LLAMA2_MODEL:-build/test-models/llama2vocab.gguf}
serve_llama2_model() {
    [ -f "$SERVE_LLAMA2_MODEL" ] && return 0
    mkdir -p "$(dirname "$SERVE_LLAMA2_MODEL")"
    build/tools/synth_model --shape 64,128,1,2,2,32000,512 --type f32 --seed 1 --tied \
        --tokenizer "$SHARED/models/tokenizer.bin" --threads 1 -o "$SERVE_LLAMA2_MODEL" >/dev/null 2>&1
}

serve_start() { # serve_start NAME ARGS...
    local name=$1 port="" i
    shift
    SERVE_LOG="$W/$name.log"
    : >"$SERVE_LOG"
    XDG_CACHE_HOME="$W/state" "$STRATA" serve -m "$SERVE_MODEL" --host 127.0.0.1 --port 0 --threads 1 "$@" \
        >"$SERVE_LOG" 2>&1 &
    SERVE_PID=$!
    SERVE_PIDS+=("$SERVE_PID")
    for ((i = 0; i < 150; i++)); do
        port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$SERVE_LOG" | head -n1)
        if [ -n "$port" ] && curl -sf -o /dev/null "http://127.0.0.1:$port/health"; then
            SERVE_PORT=$port
            SERVE_URL="http://127.0.0.1:$port"
            return 0
        fi
        kill -0 "$SERVE_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "serve_start $name: the server did not become ready:" >&2
    tail -n 20 "$SERVE_LOG" >&2
    return 1
}

serve_stop() {
    kill -TERM "$SERVE_PID" 2>/dev/null
    wait "$SERVE_PID"
    local rc=$?
    [ $rc -eq 0 ] || not_ok "server exit status $rc on SIGTERM (log $SERVE_LOG)"
}

serve_cleanup() {
    local p
    for p in "${SERVE_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for p in "${SERVE_PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
