#!/bin/bash
# Batched serving against llama.cpp's llama-server: the same model file, the same threads, the
# same context budget, the same concurrent requests, the two servers run in turn.
#
#   LLAMA_CPP=/path/to/llama.cpp/build/bin tests/bench/vs_llama_server.sh
#
# LLAMA_CPP defaults to /work/oracle/llama.cpp/build/bin when that holds llama-server; otherwise
# the script stops with an error naming the variable (llama.cpp is built outside the project).
#
# Model: tests/tools/synth_model writes the stories110M shape (dim 768, 12 layers, 12 heads, the
# Llama 2 vocabulary from ../shared/models/tokenizer.bin, random weights) in VS_PRESET (Q4_0) to
# build/bench-models/ once. On a 2-vCPU host this size lets a round of 32 clients x 512-token
# prompts finish in seconds (prefill ~2000 tok/s), where TinyLlama's would take minutes
# (~100 tok/s); SERVE_MODEL=FILE takes any other GGUF both can run (VS_VOCAB then sizes the
# random prompt ids).
#
# Scenarios (VS_CLIENTS x VS_PROMPTS): C clients in a closed loop (tests/tools/loadgen --clients:
# each sends its next request when its last ended), VS_PER_CLIENT requests each, P random prompt
# token ids, VS_GEN output tokens forced with "ignore_eos" (both servers honour it, so every
# request of both returns exactly VS_GEN tokens), greedy, streamed; TTFT is the first streamed
# chunk with a token, throughput the output tokens over the scenario's makespan. The same --seed
# gives both servers the same prompts.
#
# What each server is given (both: VS_THREADS threads, VS_CTX positions per sequence, C
# sequences at once, f16 KV cache, loopback):
#   llama-server -t T -tb T -np C -c C*CTX -cb (continuous batching, its default) --no-mmap (the
#                weights read into memory, as Strata does: through the page cache's 4 KiB pages
#                its decode was 30-45% slower on a Zen 5 host, tests/bench/vs_llamacpp.sh),
#                otherwise its defaults (-b 2048 -ub 512, flash attention auto); VS_LLAMA_ARGS
#                adds more.
#                Its environment has OMP_WAIT_POLICY=passive (VS_LLAMA_ENV replaces it): this
#                llama.cpp build uses OpenMP, whose threads spin at every barrier by default, and
#                on a shared host whose other work takes the CPUs from them that made it 4-7x
#                slower (8 clients, 16-token prompts: 17 against 114 tok/s on 2026-11-26 at
#                load 5.5); passive is its best on such a host (on an idle one spinning wins a
#                little). Strata's pool spins 50 us, then sleeps.
#   strata serve --threads T --max-batch C --ctx CTX, otherwise its defaults (--step-tokens 256,
#                --ttft-ms 1000 --tpot-ms 100: the requests carry no SLO of their own);
#                VS_STRATA_ARGS adds more
# Each server starts fresh for each scenario and round, gets a warm-up of C short requests (not
# measured), then the measured run; the two alternate (which goes first alternates by round), and
# each figure is the median of VS_ROUNDS rounds. The 1-minute load average is printed with each
# run and each row: on a shared host others' work moves every figure.
# Not part of make test (tests/bench: make bench).
set -u
cd "$(dirname "$0")/../.."
LL=${LLAMA_CPP:-}
if [ -z "$LL" ] && [ -x /work/oracle/llama.cpp/build/bin/llama-server ]; then
    LL=/work/oracle/llama.cpp/build/bin
fi
if [ -z "$LL" ] || [ ! -x "$LL/llama-server" ]; then
    echo "vs_llama_server: no llama-server in '${LL:-}': set LLAMA_CPP to llama.cpp's build/bin" \
        "(llama.cpp is built outside the project)" >&2
    exit 2
fi
CLIENTS=${VS_CLIENTS:-8 32}
PROMPTS=${VS_PROMPTS:-16 512}
PER_CLIENT=${VS_PER_CLIENT:-2}
GEN=${VS_GEN:-64}
THREADS=${VS_THREADS:-2}
CTX=${VS_CTX:-1024}
ROUNDS=${VS_ROUNDS:-3}
PRESET=${VS_PRESET:-Q4_0}
VOCAB=${VS_VOCAB:-32000}
SHARED=${STRATA_SHARED:-../shared}
make -s -j2 build/strata build/tools/synth_model build/tools/loadgen >/dev/null || exit 1
if [ -z "${SERVE_MODEL:-}" ]; then
    SERVE_MODEL=build/bench-models/stories110M-llama2vocab-$PRESET.gguf
    if [ ! -f "$SERVE_MODEL" ]; then
        mkdir -p build/bench-models
        build/tools/synth_model --shape stories110M --preset "$PRESET" --seed 1 \
            --tokenizer "$SHARED/models/tokenizer.bin" -o "$SERVE_MODEL" >/dev/null ||
            { echo "vs_llama_server: cannot write $SERVE_MODEL" >&2; rm -f "$SERVE_MODEL"; exit 1; }
    fi
fi
W=$(mktemp -d /tmp/vs_llama_server.XXXXXX)
PID=""
cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server llama|strata CLIENTS: starts it on a free loopback port, waits for /health 200
# (120 s at most); sets PID and URL
start_server() {
    local which=$1 c=$2 port i
    port=$(free_port)
    URL=http://127.0.0.1:$port
    if [ "$which" = llama ]; then
        # shellcheck disable=SC2086
        env ${VS_LLAMA_ENV:-OMP_WAIT_POLICY=passive} "$LL/llama-server" -m "$SERVE_MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -tb "$THREADS" -np "$c" -c $((c * CTX)) -cb --no-mmap ${VS_LLAMA_ARGS:-} >"$W/$which.log" 2>&1 &
    else
        # shellcheck disable=SC2086
        XDG_CACHE_HOME="$W/state" build/strata serve -m "$SERVE_MODEL" --host 127.0.0.1 \
            --port "$port" --threads "$THREADS" --max-batch "$c" --ctx "$CTX" \
            ${VS_STRATA_ARGS:-} >"$W/$which.log" 2>&1 &
    fi
    PID=$!
    for ((i = 0; i < 1200; i++)); do
        curl -sf -o /dev/null "$URL/health" && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "vs_llama_server: $which did not become ready:" >&2
    tail -n 20 "$W/$which.log" >&2
    return 1
}
stop_server() {
    kill -TERM "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=""
}

# run_one llama|strata CLIENTS PROMPT: one measured run; appends "which c p tps p50 p99 load tpot50"
run_one() {
    local which=$1 c=$2 p=$3 out
    start_server "$which" "$c" || return 1
    build/tools/loadgen --url "$URL" --clients "$c" --requests "$c" --prompt-len 16 --gen 8 \
        --vocab "$VOCAB" --no-slo --seed 7 --label warmup >/dev/null 2>&1
    out=$(build/tools/loadgen --url "$URL" --clients "$c" --requests $((c * PER_CLIENT)) \
        --prompt-len "$p" --gen "$GEN" --vocab "$VOCAB" --no-slo --seed 1 \
        --label "$which-c$c-p$p" 2>/dev/null | grep '^RESULT')
    stop_server
    local l
    l=$(load)
    echo "# $which c=$c p=$p load $l: $out" >&2
    awk -v w="$which" -v c="$c" -v p="$p" -v l="$l" -v want=$((c * PER_CLIENT * GEN)) '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["failed"] != 0 || v["tokens"] != want) {
            printf "# %s c=%s p=%s: %s failed, %s of %s tokens: not counted\n", w, c, p, v["failed"],
                v["tokens"], want > "/dev/stderr"; exit }
        print w, c, p, v["throughput"], v["ttft_p50_ms"], v["ttft_p99_ms"], l, v["tpot_p50_ms"] }' <<<"$out" \
        >>"$W/results"
}

echo "vs_llama_server: $SERVE_MODEL, $THREADS threads, ctx $CTX per sequence, $GEN output" \
    "tokens (EOS ignored), $PER_CLIENT requests per client, $ROUNDS rounds; llama.cpp $LL;" \
    "llama-server's environment ${VS_LLAMA_ENV:-OMP_WAIT_POLICY=passive};" \
    "extra arguments: llama-server '${VS_LLAMA_ARGS:-}', strata serve '${VS_STRATA_ARGS:-}'; $(nproc) CPUs," \
    "$(uptime | sed 's/.*load/load/')"
: >"$W/results"
for ((r = 0; r < ROUNDS; r++)); do
    for c in $CLIENTS; do
        for p in $PROMPTS; do
            if ((r % 2 == 0)); then order="llama strata"; else order="strata llama"; fi
            for which in $order; do run_one "$which" "$c" "$p"; done
        done
    done
done

printf '%-16s | %-38s | %-38s | %-26s | %s\n' "" "llama-server" "strata serve" "Strata / llama.cpp" ""
printf '%-16s | %8s %9s %9s %9s | %8s %9s %9s %9s | %6s %9s %9s | %s\n' scenario "tok/s" "TTFT p50" \
    "TTFT p99" "TPOT p50" "tok/s" "TTFT p50" "TTFT p99" "TPOT p50" "tok/s" "TTFT p50" "TTFT p99" \
    "load (runs)"
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for c in $CLIENTS; do
    for p in $PROMPTS; do
        declare -A M=()
        for which in llama strata; do
            for k in 4 5 6 8; do
                M[$which$k]=$(awk -v w="$which" -v c="$c" -v p="$p" -v k="$k" \
                    '$1 == w && $2 == c && $3 == p { print $k }' "$W/results" | median)
            done
        done
        loads=$(awk -v c="$c" -v p="$p" '$2 == c && $3 == p { printf "%s%s", s, $7; s = " " }' \
            "$W/results")
        awk -v sc="c$c p$p" -v lt="${M[llama4]:-0}" -v l50="${M[llama5]:-0}" -v l99="${M[llama6]:-0}" \
            -v st="${M[strata4]:-0}" -v s50="${M[strata5]:-0}" -v s99="${M[strata6]:-0}" \
            -v lp="${M[llama8]:-0}" -v sp="${M[strata8]:-0}" \
            -v loads="$loads" -v gen="$GEN" 'function r(a, b) { return b > 0 ? sprintf("%.2fx", a / b) : "-" }
            BEGIN {
            printf "%-16s | %8.1f %7.0fms %7.0fms %7.0fms | %8.1f %7.0fms %7.0fms %7.0fms | %6s %9s %9s | %s\n",
                sc " g" gen, lt, l50, l99, lp, st, s50, s99, sp, r(st, lt), r(l50, s50), r(l99, s99), loads }'
    done
done
echo "(medians of $ROUNDS rounds; ratios: Strata's tok/s over llama.cpp's, llama.cpp's TTFT over" \
    "Strata's: above 1 is Strata better; scenario cC pP gG: C clients, P prompt tokens, G output tokens;" \
    "TPOT: time per output token after the first)"
