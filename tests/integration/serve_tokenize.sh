#!/bin/bash
# POST /tokenize, POST /detokenize and `strata tokenize` against llama.cpp's own answers
# (tests/fixtures/tokenize: llama-server and llama-tokenize 10e97801 on the same two GGUFs, the
# stories260K model and a random-weight model with the Llama 2 vocabulary). A real `strata serve`
# on loopback for each: every fixture request answered byte for byte as llama-server answered it
# (status 200, Content-Type application/json); errors in the API's shape (bad JSON 400, an id
# outside the vocabulary 400, GET 405); with --api-key 401 without the key and the same answer
# with it. The command line: every llama-tokenize output byte for byte, `strata help` lists it,
# "-" reads standard input, usage errors exit 2, an unreadable model exits 1 naming it, and a
# GGUF whose one tensor claims 5 GiB (a sparse file) tokenizes with a few MB resident: the
# weights are never read.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/serve_tokenize.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
FIX=tests/fixtures/tokenize
L2=$SERVE_LLAMA2_MODEL
serve_model || { not_ok "serve_tokenize: cannot convert the test model"; exit 1; }
serve_llama2_model || { not_ok "serve_tokenize: cannot write $L2"; exit 1; }

# check_answers MODEL URL [KEY]: every fixture request of MODEL, the exact answer
check_answers() {
    python3 - "$FIX/llama_server.jsonl" "$1" "$2" "${3:-}" <<'PY'
import json, sys, urllib.request
fixture, model, url, key = sys.argv[1:5]
n = 0
for line in open(fixture, encoding="utf-8"):
    row = json.loads(line)
    if row["model"] != model:
        continue
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url + row["path"], data=row["body"].encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        body, status, ctype = r.read(), r.status, r.headers["Content-Type"]
    want = row["response"].encode()
    assert status == 200 and ctype == "application/json", (row["path"], row["body"], status, ctype)
    assert body == want, f"{row['path']} {row['body']}:\n  got       {body!r}\n  llama.cpp {want!r}"
    n += 1
assert n >= 10, n
print(n)
PY
}

# status PATH BODY [CURL ARGS]: the HTTP status; the body in $W/r
status() {
    local path=$1 body=$2
    shift 2
    curl -s -m 10 -o "$W/r" -w '%{http_code}' "$@" "$SERVE_URL$path" \
        -H 'Content-Type: application/json' -d "$body"
}

serve_start stories || { not_ok "serve_tokenize: start"; exit 1; }
n=$(check_answers stories260K "$SERVE_URL" 2>"$W/err") &&
    ok "serve_tokenize: stories260K: $n /tokenize and /detokenize answers byte for byte as llama-server's" ||
    not_ok "serve_tokenize: stories260K: $(tail -n 3 "$W/err")"
c=$(status /tokenize '{"content":')
c=$c,$(status /detokenize '{"tokens":[1,512]}')
grep -q "token id 512 at index 1 is outside the vocabulary (512 tokens)" "$W/r" || c="$c (message: $(cat "$W/r"))"
c=$c,$(curl -s -o "$W/r" -w '%{http_code}' "$SERVE_URL/tokenize")
grep -q '"error":{"message":"Method GET is not allowed for /tokenize."' "$W/r" || c="$c (GET: $(cat "$W/r"))"
[ "$c" = 400,400,405 ] && ok "serve_tokenize: bad JSON 400, an id outside the vocabulary 400, GET 405, in the API's error shape" ||
    not_ok "serve_tokenize: errors: $c"
serve_stop

SERVE_MODEL=$L2 serve_start llama2 --api-key sk-tok || { not_ok "serve_tokenize: start with the Llama 2 vocabulary"; exit 1; }
c=$(status /tokenize '{"content":"Hello"}'),$(status /detokenize '{"tokens":[1]}' -H 'Authorization: Bearer nope')
grep -q '"message":"Incorrect API key provided."' "$W/r" || c="$c ($(cat "$W/r"))"
[ "$c" = 401,401 ] && ok "serve_tokenize: --api-key: /tokenize and /detokenize without the key (or a wrong one) get 401" ||
    not_ok "serve_tokenize: api key: $c"
n=$(check_answers llama2vocab "$SERVE_URL" sk-tok 2>"$W/err") &&
    ok "serve_tokenize: Llama 2 vocabulary, with the key: $n answers byte for byte as llama-server's" ||
    not_ok "serve_tokenize: Llama 2 vocabulary: $(tail -n 3 "$W/err")"
serve_stop

# ---- the command line
python3 - "$FIX/llama_tokenize.jsonl" "$STRATA" "$SERVE_MODEL" "$L2" <<'PY' >"$W/cli" 2>&1 &&
import base64, json, subprocess, sys
fixture, strata, stories, l2 = sys.argv[1:5]
models = {"stories260K": stories, "llama2vocab": l2}
n = 0
for line in open(fixture, encoding="utf-8"):
    row = json.loads(line)
    argv = [strata, "tokenize", "-m", models[row["model"]]] + row["strata_args"] + [row["text"]]
    p = subprocess.run(argv, capture_output=True, timeout=30)
    want = base64.b64decode(row["stdout_b64"])
    assert p.returncode == 0 and p.stdout == want, f"{argv}: rc {p.returncode}\n  got      {p.stdout[:300]!r}\n  llama.cpp {want[:300]!r}"
    n += 1
print(n)
PY
    ok "serve_tokenize: strata tokenize: $(cat "$W/cli") runs (ids, pieces, --ids, --no-bos, --parse-special) byte for byte as llama-tokenize's" ||
    not_ok "serve_tokenize: strata tokenize: $(tail -n 4 "$W/cli")"

"$STRATA" help | grep -q '^  strata tokenize -m MODEL.gguf' && ok "serve_tokenize: strata help lists tokenize" ||
    not_ok "serve_tokenize: strata help does not list tokenize"
printf 'Hello\n world \xc3\xa1' | "$STRATA" tokenize -m "$L2" - >"$W/stdin" 2>&1
"$STRATA" tokenize -m "$L2" "$(printf 'Hello\n world \xc3\xa1')" >"$W/arg" 2>&1
cmp -s "$W/stdin" "$W/arg" && [ "$(wc -l <"$W/arg")" -ge 5 ] &&
    ok "serve_tokenize: strata tokenize - reads the text from standard input" ||
    not_ok "serve_tokenize: stdin: $(head -c 200 "$W/stdin") vs $(head -c 200 "$W/arg")"
"$STRATA" tokenize -m "$SERVE_MODEL" >/dev/null 2>"$W/u1"
r1=$?
"$STRATA" tokenize "text" --bogus >/dev/null 2>"$W/u2"
r2=$?
"$STRATA" tokenize -m "$W/missing.gguf" "text" >/dev/null 2>"$W/u3"
r3=$?
[ $r1 = 2 ] && [ $r2 = 2 ] && grep -q '^usage: strata tokenize' "$W/u1" && [ $r3 = 1 ] &&
    grep -q "^strata tokenize: $W/missing.gguf: No such file or directory" "$W/u3" &&
    ok "serve_tokenize: usage errors exit 2, a missing model exits 1 naming it" ||
    not_ok "serve_tokenize: usage/missing: $r1 $r2 $r3 $(cat "$W/u1" "$W/u3")"

# A GGUF holding the Llama 2 tokenizer and one tensor that claims 5 GiB (sparse, never written):
# tokenizing it must not read the tensor.
python3 - "$L2" "$W/big.gguf" <<'PY' && "$STRATA" tokenize -m "$L2" "Hello world" >"$W/small" 2>&1 &&
import struct, sys
src, dst = sys.argv[1:3]
b = open(src, "rb").read()
n_kv = struct.unpack_from("<Q", b, 16)[0]
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def value(o, t):
    if t == 8:
        return o + 8 + struct.unpack_from("<Q", b, o)[0]
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, o)
        o += 12
        for _ in range(n):
            o = value(o, et)
        return o
    return o + size[t]
o, kvs = 24, []
for _ in range(n_kv):
    start = o
    klen = struct.unpack_from("<Q", b, o)[0]
    key = b[o + 8:o + 8 + klen]
    o = value(o + 8 + klen + 4, struct.unpack_from("<I", b, o + 8 + klen)[0])
    if key.startswith(b"tokenizer.") or key == b"general.architecture":
        kvs.append(b[start:o])
name = b"token_embd.weight"
ne = (64, 5 << 22)  # 64 x 20971520 f32 = 5 GiB
out = struct.pack("<IIQQ", 0x46554747, 3, 1, len(kvs)) + b"".join(kvs)
out += struct.pack("<Q", len(name)) + name + struct.pack("<IQQIQ", 2, ne[0], ne[1], 0, 0)
out += b"\0" * (-len(out) % 32)
with open(dst, "wb") as f:
    f.write(out)
    f.truncate(len(out) + ne[0] * ne[1] * 4)
PY
    python3 - "$STRATA" "$W/big.gguf" "$W/small" <<'PY' >"$W/big" 2>&1
import os, resource, subprocess, sys, time
strata, big, small = sys.argv[1:4]
t = time.monotonic()
p = subprocess.run([strata, "tokenize", "-m", big, "Hello world"], capture_output=True, timeout=60)
dt = time.monotonic() - t
rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
assert os.path.getsize(big) > 5 << 30, os.path.getsize(big)
assert p.returncode == 0 and p.stdout == open(small, "rb").read(), (p.returncode, p.stdout, p.stderr)
assert rss_mb < 256, f"{rss_mb:.0f} MB resident: the weights were read"
print(f"{rss_mb:.0f} MB resident, {dt * 1000:.0f} ms")
PY
if [ $? = 0 ]; then
    ok "serve_tokenize: a 5 GiB GGUF tokenizes as the small one, weights untouched ($(cat "$W/big"))"
else
    not_ok "serve_tokenize: the 5 GiB GGUF: $(tail -n 3 "$W/big")"
fi
exit $fail
