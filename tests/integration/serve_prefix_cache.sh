#!/bin/bash
# The prefix cache with the real engine (~10 s): `strata serve` with the tiny model answers
# prompts that share their beginnings (the same prompt again, it with more text after, one that
# shares its first two sentences, one that differs in its first words) each exactly as `strata
# generate --temp 0` does alone, f16 and f32 KV cache; /metrics and each answer's
# usage.prompt_tokens_details.cached_tokens count the prompt tokens taken from the cache (every
# whole block below the last position for a prompt sent again, none for a first prompt); with
# --no-prefix-cache the same texts and no cached token.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_prefix_cache.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "serve_prefix_cache: cannot convert the test model"; exit 1; }
command -v python3 >/dev/null || { echo "skip - serve_prefix_cache: needs python3"; exit 0; }

STORY="Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. One day, she saw a big red ball in the park."
PROMPTS=("$STORY" "$STORY" "$STORY She ran to get it."
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. Then it rained."
    "Once upon a time, there was a little boy named Tom. She loved to play outside in the sun. One day, she saw a big red ball in the park.")
N=24
for i in "${!PROMPTS[@]}"; do
    "$STRATA" generate -m "$SERVE_MODEL" -p "${PROMPTS[$i]}" -n $N --temp 0 --threads 1 2>/dev/null >"$W/gen$i"
done
metric() { curl -s "$SERVE_URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

run() { # run NAME SERVE-ARGS...: every prompt in turn; prints the cached-token count after each
    local name=$1 i
    shift
    serve_start "$name" --threads 1 "$@" || { not_ok "serve_prefix_cache: $name: start"; return 1; }
    : >"$W/$name.cached"
    for i in "${!PROMPTS[@]}"; do
        python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": int(sys.argv[2]), "temperature": 0}))' \
            "${PROMPTS[$i]}" $N >"$W/req$i"
        curl -s "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' -d @"$W/req$i" >"$W/$name.out$i"
        echo "$(metric strata_prompt_cached_tokens_total) $(metric strata_prompt_tokens_total)" >>"$W/$name.cached"
    done
    serve_stop
}

check() { # check NAME CACHED(yes/no)
    python3 - "$W" "$1" "$2" "${#PROMPTS[@]}" <<'PY'
import json, sys
w, name, cached, n = sys.argv[1], sys.argv[2], sys.argv[3] == "yes", int(sys.argv[4])
prompts = [open(f"{w}/req{i}").read() for i in range(n)]
usage = []
for i in range(n):
    p = json.loads(prompts[i])["prompt"]
    gen = open(f"{w}/gen{i}", "rb").read().decode()
    want = gen[len(p):-1]
    reply = json.load(open(f"{w}/{name}.out{i}"))
    got = reply["choices"][0]["text"]
    assert got == want, f"prompt {i}: served {got!r}, generate {want!r}"
    usage.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
counts = [tuple(map(int, l.split())) for l in open(f"{w}/{name}.cached")]
hits = [counts[0][0]] + [counts[i][0] - counts[i - 1][0] for i in range(1, n)]
toks = [counts[0][1]] + [counts[i][1] - counts[i - 1][1] for i in range(1, n)]
if not cached:
    assert not any(hits), hits
else:
    # a first prompt takes nothing; the same prompt again every whole block but the one with its
    # last position (blocks of 16); more text after it at least as much; the first two sentences
    # shared (31 tokens) one block; a prompt that differs in its 8th word (its first block) none
    assert hits[0] == 0, hits
    assert 0 < hits[1] < toks[1] and toks[1] - hits[1] <= 16, (hits, toks)
    assert hits[2] >= hits[1], (hits, toks)
    assert 0 < hits[3] < hits[1] and hits[4] == 0, (hits, toks)
assert usage == hits, f"usage.prompt_tokens_details.cached_tokens {usage}, /metrics {hits}"
print(f"{name}: prompt tokens {toks}, from the cache {hits} (/metrics and each answer's usage)")
PY
}

for kv in f16 f32; do
    run "px_$kv" --kv-type $kv &&
        if out=$(check "px_$kv" yes 2>&1); then
            ok "serve_prefix_cache: $kv KV: 5 prompts sharing beginnings each == strata generate --temp 0; $out"
        else
            not_ok "serve_prefix_cache: $kv KV: $out"
        fi
done
run off --no-prefix-cache &&
    if out=$(check off no 2>&1); then
        ok "serve_prefix_cache: --no-prefix-cache: the same texts, $out"
    else
        not_ok "serve_prefix_cache: --no-prefix-cache: $out"
    fi
exit $fail
