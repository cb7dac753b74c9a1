#!/bin/bash
# The architectures end to end against llama.cpp: the models of tests/fixtures/arch-refs (llama
# with GQA; Llama 3.1's rope_freqs with heads of 96 on dim 256; qwen2's q/k/v biases and tied
# output; qwen3's q/k norms with heads of 128) are synthesized with synth_model, must be the files
# the references were made from (SHA256SUMS), and `strata generate --temp 0` must print llama.cpp's
# greedy continuation byte for byte for every row of greedy.jsonl (prompts up to 1457 tokens; the
# README there says how the rows were made). Also: a file of another architecture fails with one
# line naming it and the supported ones.
set -u
cd "$(dirname "$0")/../.."
S=${STRATA_SHARED:-../shared}/models
F=tests/fixtures/arch-refs
B=build/strata
T=build/tools/synth_model
W=build/test-arch-refs
PY=/usr/bin/python3
rm -rf "$W"
mkdir -p "$W"
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1"; fail=1; }

while read -r name args; do
    # shellcheck disable=SC2086 # the arguments are words
    if $T $args --tokenizer "$S/tok512.bin" -o "$W/$name.gguf" 2>"$W/synth.err"; then
        want=$(grep " $name.gguf\$" "$F/SHA256SUMS" | cut -d' ' -f1)
        got=$(sha256sum "$W/$name.gguf" | cut -d' ' -f1)
        [ "$want" == "$got" ] && ok "synth_model $name is the file the references were made from" \
            || nok "synth_model $name: sha256 $got, the references were made from $want"
    else
        nok "synth_model $name: $(cat "$W/synth.err")"
    fi
done <"$F/models.txt"

# Each row into files: the prompt, and what generate must print (prompt, continuation, newline).
if ! $PY - "$F/greedy.jsonl" "$W" <<'PYEOF'; then
import base64, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2] + "/rows", "w") as idx:
    for i, r in enumerate(rows):
        open("%s/%d.prompt" % (sys.argv[2], i), "wb").write(r["prompt"].encode())
        open("%s/%d.want" % (sys.argv[2], i), "wb").write(
            r["prompt"].encode() + base64.b64decode(r["continuation_b64"]) + b"\n")
        idx.write("%d %s %d %d\n" % (i, r["file"], r["max_tokens"], r["prompt_tokens"]))
PYEOF
    nok "reading $F/greedy.jsonl with $PY"
    exit 1
fi
while read -r i file n np; do
    $B generate -m "$W/$file" -p "$(cat "$W/$i.prompt")" -n "$n" --temp 0 >"$W/$i.got" 2>"$W/$i.err"
    if cmp -s "$W/$i.want" "$W/$i.got"; then
        ok "$file row $i ($np-token prompt): $n greedy tokens as llama.cpp's"
    else
        nok "$file row $i ($np-token prompt): want $(tail -c +$(($(wc -c <"$W/$i.prompt") + 1)) "$W/$i.want" | od -An -c | tr -s ' ' | head -c 300), got $(tail -c +$(($(wc -c <"$W/$i.prompt") + 1)) "$W/$i.got" | od -An -c | tr -s ' ' | head -c 300) $(tail -1 "$W/$i.err")"
    fi
done <"$W/rows"

# Another architecture: one line that names it and the supported ones.
$PY - "$W/llama-gqa.gguf" "$W/mamba.gguf" <<'PYEOF'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
at = d.find(b"general.architecture") + len("general.architecture") + 4 + 8  # type, length
assert d[at:at + 5] == b"llama"
d[at:at + 5] = b"mamba"
open(sys.argv[2], "wb").write(d)
PYEOF
msg=$($B generate -m "$W/mamba.gguf" -p x -n 1 2>&1 >/dev/null); rc=$?
want="strata generate: $W/mamba.gguf: general.architecture is \"mamba\", which is not supported (llama, qwen2, qwen3 are)"
[ $rc -eq 1 ] && [ "$msg" == "$want" ] && ok "another architecture: one line naming it and the supported ones" \
    || nok "another architecture: rc $rc, '$msg'"
exit $fail
