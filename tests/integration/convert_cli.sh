#!/bin/bash
# `strata convert` and `synth_model` from the command line: exit codes (0 ok, 1 failure, 2 usage)
# and one-line messages that name the file and the problem.
set -u
cd "$(dirname "$0")/../.."
S=${STRATA_SHARED:-../shared}/models
B=build/strata
W=build/test-convert-cli
mkdir -p "$W"
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1"; fail=1; }
expect() { # expect <name> <status> <stderr substring> cmd...
    local name=$1 want=$2 msg=$3; shift 3
    "$@" >"$W/out" 2>"$W/err"
    local rc=$?
    if [ $rc -eq "$want" ] && { [ -z "$msg" ] || grep -qF -- "$msg" "$W/err"; }; then ok "$name"
    else nok "$name: status $rc (want $want), stderr: $(head -c 300 "$W/err")"; fi
}

expect "convert without arguments is a usage error" 2 "usage: strata convert" $B convert
expect "convert with an unknown type is a usage error" 2 "unknown type 'q8_1'" \
    $B convert --tokenizer "$S/tok512.bin" "$S/stories260K.bin" "$W/x.gguf" --type q8_1
expect "convert with an unknown option names it" 2 "strata convert: unknown option '--bogus'" \
    $B convert --tokenizer "$S/tok512.bin" "$S/stories260K.bin" "$W/x.gguf" --bogus
expect "inspect of two files is a usage error naming the second" 2 "unexpected argument 'b.gguf'" \
    $B inspect a.gguf b.gguf
expect "convert of a missing checkpoint names it" 1 "$W/nope.bin: No such file or directory" \
    $B convert --tokenizer "$S/tok512.bin" "$W/nope.bin" "$W/x.gguf"
head -c 1000000 "$S/stories260K.bin" >"$W/trunc.bin"
expect "convert of a truncated checkpoint gives the sizes" 1 \
    "trunc.bin: 1000000 bytes, but its header (dim 64, hidden_dim 172, n_layers 5, n_heads 8, n_kv_heads 4, vocab 512, seq_len 512, shared classifier) needs 1056540" \
    $B convert --tokenizer "$S/tok512.bin" "$W/trunc.bin" "$W/x.gguf"
[ ! -e "$W/x.gguf" ] && [ ! -e "$W/x.gguf.tmp" ] && ok "a failed convert leaves no file" \
    || nok "a failed convert leaves no file"
expect "convert with the wrong tokenizer says so" 1 "tokenizer.bin: tokenizer: " \
    $B convert --tokenizer "$S/tokenizer.bin" "$S/stories260K.bin" "$W/x.gguf"
for t in f32 q8_0 q4_0; do
    expect "convert --type $t" 0 "wrote $W/s-$t.gguf" \
        $B convert --tokenizer "$S/tok512.bin" "$S/stories260K.bin" "$W/s-$t.gguf" --type $t
done
$B inspect "$W/s-q8_0.gguf" >"$W/out" 2>&1
grep -q "llama: dim 64, hidden 172, layers 5, heads 8 (kv 4, head dim 8), vocab 512, context 512" "$W/out" \
    && grep -q "q8_0 attention, q8_0 ffn gate/up, f32 ffn down" "$W/out" && grep -q "file in execution order" "$W/out" \
    && grep -q "tokenizer: llama, 512 tokens, bos 1, eos 2, 256 byte tokens" "$W/out" \
    && ok "inspect shows the config, types and spans" || nok "inspect: $(cat "$W/out")"
head -c 5000 "$W/s-q8_0.gguf" >"$W/cut.gguf"
expect "inspect of a truncated GGUF names the file and the place" 1 \
    "cut.gguf: key 'tokenizer.ggml.tokens': element 324: truncated at byte 5000" $B inspect "$W/cut.gguf"
# Converting twice gives the same bytes.
$B convert --tokenizer "$S/tok512.bin" "$S/stories260K.bin" "$W/s-again.gguf" --type q8_0 2>/dev/null
cmp -s "$W/s-q8_0.gguf" "$W/s-again.gguf" && ok "convert is deterministic" \
    || nok "convert is deterministic"

T=build/tools/synth_model
expect "synth_model tiny-gqa q4_k" 0 "" $T --shape tiny-gqa --type q4_k --seed 3 -o "$W/g.gguf"
$T --shape tiny-gqa --type q4_k --seed 3 --threads 1 -o "$W/g2.gguf" 2>/dev/null
$T --shape tiny-gqa --type q4_k --seed 4 -o "$W/g3.gguf" 2>/dev/null
cmp -s "$W/g.gguf" "$W/g2.gguf" && ! cmp -s "$W/g.gguf" "$W/g3.gguf" \
    && ok "synth_model is deterministic in the seed (1 or all threads)" \
    || nok "synth_model is deterministic in the seed (1 or all threads)"
expect "synth_model with a real vocabulary" 0 "" \
    $T --shape 64,128,1,4,2,32000,64 --type q8_0 --seed 1 --tokenizer "$S/tokenizer.bin" -o "$W/v.gguf"
expect "synth_model rejects an inconsistent shape" 2 "inconsistent shape" \
    $T --shape 10,8,1,3,1,8,8 --type f32 --seed 1 -o "$W/bad.gguf"
expect "synth_model with a vocabulary of the wrong size" 1 "the model needs 600" \
    $T --shape 64,128,1,4,2,600,64 --type f32 --seed 1 --tokenizer "$S/tok512.bin" -o "$W/bad.gguf"
rm -rf "$W"
exit $fail
