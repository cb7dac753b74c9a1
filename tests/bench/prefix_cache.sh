#!/bin/bash
# Prefix cache: what a prompt sent again costs. `strata serve` with a stories110M-shaped Q4_0 model
# (tests/tools/synth_model, written once to build/bench-models/), 2 threads; a ~610-token prompt
# (max_tokens 1: the time is the time to the first token), the same prompt again, it with a
# sentence more, then a 6-turn conversation where each turn sends the whole story so far plus a
# new sentence (what a chat client does). Each with the prefix cache and with --no-prefix-cache in
# the same run; the figure beside each is the one without. PC_MODEL=path.gguf, PC_THREADS=N.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
make -s -j2 build/strata build/tools/synth_model >/dev/null || exit 1
M=${PC_MODEL:-build/bench-models/stories110M-Q4_0.gguf}
if [ ! -f "$M" ]; then
    mkdir -p "$(dirname "$M")"
    build/tools/synth_model --shape stories110M --preset Q4_0 --seed 1 -o "$M" >/dev/null ||
        { echo "prefix_cache: synth_model failed"; exit 1; }
fi
W=$(mktemp -d /tmp/bench_prefix.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
SERVE_MODEL=$M
STORY=$(printf 'Once upon a time there was a little girl named Lily who loved to play in the park with her dog. %.0s' $(seq 1 12))
ask() { # ask PROMPT: seconds to the (only) token
    python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 1, "temperature": 0}))' "$1" >"$W/req"
    local r
    r=$(curl -s -o "$W/ans" -w '%{http_code} %{time_total}' "$SERVE_URL/v1/completions" -H 'Content-Type: application/json' -d @"$W/req")
    [ "${r%% *}" = 200 ] || { echo "prefix_cache: HTTP ${r%% *}: $(head -c 300 "$W/ans")" >&2; exit 1; }
    echo "${r#* }"
}
run() { # run NAME ARGS: one line of times
    serve_start "$1" --threads "${PC_THREADS:-2}" "${@:2}" || { echo "prefix_cache: $1: start failed"; exit 1; }
    local t conv=0 p="$STORY"
    t="$(ask "$STORY") $(ask "$STORY") $(ask "$STORY And then it rained.")"
    for i in 1 2 3 4 5 6; do
        p="$p Turn $i: the dog barked and Lily laughed."
        conv=$(python3 -c "print($conv + $(ask "$p"))")
    done
    echo "$t $conv $(curl -s "$SERVE_URL/metrics" | awk '$1 == "strata_prompt_cached_tokens_total" || $1 == "strata_prompt_tokens_total" { printf "%s ", $2 }')"
    serve_stop
}
on=$(run px)
off=$(run nopx --no-prefix-cache)
python3 - "$on" "$off" "$M" <<'PY'
import sys
on, off = sys.argv[1].split(), sys.argv[2].split()
print(f"prefix cache, {sys.argv[3]} (seconds to the first token; without the cache beside):")
for i, name in enumerate(["first prompt (~610 tokens)", "the same again", "it + a sentence", "6-turn conversation (sum)"]):
    a, b = float(on[i]), float(off[i])
    print(f"  {name:30s} {a:7.3f} s   without {b:7.3f} s   ({b / a:.1f}x)")
print(f"  prompt tokens {on[4]}, from the cache {on[5]} (without: {off[5]})")
PY
