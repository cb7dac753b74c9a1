#!/bin/bash
# The official `openai` npm client (installed into tests/node by `npm ci` from the committed
# package-lock.json) against strata serve: models, completions and chat, plain and streamed, with
# the exact greedy text of `strata generate --temp 0`, a second chat turn's cached prompt tokens in
# usage.prompt_tokens_details, and server errors surfacing as APIError.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_openai.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "skip - serve_openai: node/npm not installed (scripts/install-deps.sh installs them)"
    exit 0
fi
if [ ! -d tests/node/node_modules/openai ]; then
    (cd tests/node && npm ci --no-audit --no-fund >"$W/npm.log" 2>&1) || {
        echo "skip - serve_openai: npm ci could not install the openai package: $(tail -n1 "$W/npm.log")"
        exit 0
    }
fi
serve_model || { not_ok "serve_openai: cannot convert the test model"; exit 1; }
gen() { # the completion alone: generate prints the prompt first and a newline last
    "$STRATA" generate -m "$SERVE_MODEL" -p "$1" -n "$2" --temp 0 --threads 1 2>/dev/null |
        python3 -c 'import sys,json; p=sys.argv[1]; o=sys.stdin.buffer.read().decode(); print(json.dumps(o[len(p):-1]))' "$1"
}
expect="{\"completion\": $(gen 'Once upon a time' 24), \"chat\": $(gen $'User: Once upon a time\nAssistant:' 16)}"
serve_start openai || { not_ok "serve_openai: start"; exit 1; }
node tests/node/openai_client.mjs "$SERVE_URL" "$expect" || fail=1
serve_stop
exit $fail
