#!/bin/bash
# Serving as one service: every node's API answers, a completion goes where the routing table
# (planner_route) sends it and comes back through the node the client reached. Nodes, one per
# network namespace (10.77.0.N, API on :8080, control on :7100), each `strata serve --cluster`:
# node 1 serves the tiny model, its API bound to 0.0.0.0 as on the appliance (advertised at the
# host of its control address); node 2 holds it but keeps it out of its engine (--cluster-standby),
# so its routing table names node 1; node 3 is an empty member (--cluster --fabric --listen
# without -m): no model at all. Nodes are marked down only after 60 s here, so a killed
# node stays the route target for the test's duration (what a client sees in that window).
# Scenarios, one line each:
#   - through node 2: a plain and a streamed greedy completion (and a chat one), each equal to
#     `strata generate --temp 0` and to node 1's own answer, less the id and the timestamp;
#   - /metrics: node 2 counts strata_forwarded_requests_total{to="1"}, node 1 counts them in
#     strata_forwarded_received_total and served them; node 2's verbose log says where they went;
#   - X-Strata-Forwarded from a client counts for nothing: node 2 forwards the request like any
#     other, node 1 does not count it received; a bad request is answered by node 2 itself (400);
#   - X-Strata-Route: local pins a request to the node reached: node 1 serves it, the empty member
#     answers 503 (no relay), another model is a 404, another value of the header a 400;
#   - the relay's path is the sealed forward channel to node 1's control port (no connection from
#     node 2 to node 1's API port, open or in TIME_WAIT), its channels kept and reused; the
#     channel driven by hand (build/tools/fwd_probe) with the cluster key gets node 1's exact
#     greedy text, and with another key is refused at the handshake: node 1 counts the refusal
#     and serves nothing (no request, nothing received as forwarded);
#   - the empty member forwards, plain and streamed, and /tokenize and /detokenize too;
#   - a client that goes away mid-stream cancels the upstream request (node 1 counts it cancelled);
#   - node 1 killed in the middle of a stream relayed by node 2: the client gets an error event
#     naming node 1, then [DONE], then the end of the stream (curl's own time limit would fail a
#     hang); a request after that, which never started on node 1, is routed again and answered.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/fabric_netns.sh
. tests/lib/serve.sh
if [ "$(id -u)" != 0 ]; then echo "skip - cluster_forward: needs root for network namespaces"; exit 0; fi
[ -x "$STRATA" ] || { echo "not ok - cluster_forward: $STRATA not built"; exit 1; }
command -v python3 >/dev/null || { echo "skip - cluster_forward: needs python3"; exit 0; }
W=$(mktemp -d /tmp/cluster_forward.XXXXXX)
trap 'fab_cleanup; rm -rf "$W"' EXIT
serve_model || { echo "not ok - cluster_forward: cannot convert the model"; exit 1; }
MODEL=$(realpath "$SERVE_MODEL")
HB=100
PEERS="1@10.77.0.1:7100,2@10.77.0.2:7100"
fab_setup 3 || { echo "not ok - cluster_forward: network namespaces"; exit 1; }
fab_key "$W/key"
declare -A PID
COMMON=(--port 8080 --threads 1 -v --key-file "$W/key" --cluster-heartbeat-ms $HB
    --cluster-dead-ms 60000 --keep-alive-ms 600000 --cluster "$PEERS")

in_ns() { local n=$1; shift; ip netns exec "$(fab_ns "$n")" "$@"; }
cluster() { in_ns "$1" curl -s -m 2 "http://10.77.0.$1:8080/v1/cluster"; }
metrics() { in_ns "$1" curl -s -m 5 "http://10.77.0.$1:8080/metrics"; }
q() {
    cluster "$1" | python3 -c "
import json, sys
try:
    d = json.load(sys.stdin)
except Exception:
    sys.exit(0)
node = lambda i: ([n for n in d['nodes'] if n['id'] == i] + [None])[0]
engine = lambda i: node(i) is not None and node(i)['alive'] and any(m['engine'] and m['layers_resident'] == m['layers'] for m in node(i)['models'])
print($2)" 2>/dev/null
}
until_true() {
    local end=$((SECONDS + $1))
    while [ $SECONDS -lt $end ]; do
        [ "$(q "$2" "$3")" = True ] && return 0
        sleep 0.2
    done
    return 1
}
# post N PATH BODY OUT [CURL ARGS]: POST to node N's API; prints the HTTP status
post() {
    local n=$1 path=$2 body=$3 out=$4
    shift 4
    in_ns "$n" curl -s -m 60 -o "$out" -w '%{http_code}' "$@" "http://10.77.0.$n:8080$path" \
        -H 'Content-Type: application/json' -d "$body"
}
metric() { # metric N NAME{LABELS}: the value, 0 when absent
    local v
    v=$(metrics "$1" | awk -v k="$2" '$1 == k { print $2 }')
    echo "${v:-0}"
}

# Node 1 serves (each step slowed, so long streams last seconds); node 2 stands by.
fab_bg 1 "$W/n1" "$STRATA" serve -m "$MODEL" --host 0.0.0.0 --node-id 1 --raft-dir "$W/raft1" \
    --test-step-delay-us 40000 "${COMMON[@]}"
PID[1]=$FAB_LAST
fab_bg 2 "$W/n2" "$STRATA" serve -m "$MODEL" --host 10.77.0.2 --node-id 2 --raft-dir "$W/raft2" \
    --cluster-standby "${COMMON[@]}"
PID[2]=$FAB_LAST
if ! until_true 90 2 "engine(1) and node(2) is not None and node(2)['alive'] and not engine(2) and d['leader'] is not None"; then
    echo "not ok - cluster_forward: node 2 never saw node 1 serving: $(cluster 2)"
    exit 1
fi

# ---- 1. the same answer through node 2 as from one node
"$STRATA" generate -m "$MODEL" -p "Once upon a time" -n 30 --temp 0 --threads 1 2>/dev/null >"$W/gen"
CMPL='{"model":"stories260K","prompt":"Once upon a time","max_tokens":30,"temperature":0}'
STRM='{"model":"stories260K","prompt":"Once upon a time","max_tokens":30,"temperature":0,"stream":true}'
CHAT='{"model":"stories260K","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":20,"temperature":0}'
c1=$(post 2 /v1/completions "$CMPL" "$W/fwd_plain")
c2=$(post 2 /v1/completions "$STRM" "$W/fwd_stream" -N)
c3=$(post 2 /v1/chat/completions "$CHAT" "$W/fwd_chat")
post 1 /v1/completions "$CMPL" "$W/own_plain" >/dev/null
post 1 /v1/completions "$STRM" "$W/own_stream" -N >/dev/null
post 1 /v1/chat/completions "$CHAT" "$W/own_chat" >/dev/null
if [ "$c1$c2$c3" = 200200200 ] && python3 - "$W" <<'PY'; then
import json, re, sys
w = sys.argv[1]
gen = open(f"{w}/gen", "rb").read().decode()
want = gen[len("Once upon a time"):-1]
def norm(text):  # the id, the timestamp and the prompt tokens the prefix cache served (the
    # same request asked again finds its prompt cached) differ between two answers
    text = re.sub(r'"cached_tokens":\d+', '"cached_tokens":0', text)
    return re.sub(r'"created":\d+', '"created":0', re.sub(r'"id":"[a-z]+-\d+"', '"id":"x"', text))
def stream(path):
    """The text, the last chunk and the shape of the others: how the tokens group into events
    depends on when the server flushed, on one node as through two."""
    ev = [b[6:] for b in open(path).read().split("\n\n") if b.startswith("data: ")]
    assert ev[-1] == "[DONE]", ev[-1]
    chunks = [json.loads(norm(e)) for e in ev[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    for c in chunks:
        c["choices"][0]["text"] = ""
    return text, chunks[-1], {json.dumps(c) for c in chunks[:-1]}
plain = json.load(open(f"{w}/fwd_plain"))["choices"][0]["text"]
fwd, own = stream(f"{w}/fwd_stream"), stream(f"{w}/own_stream")
assert plain == want and fwd[0] == want, (plain, fwd[0], want)
assert fwd == own, (fwd, own)
for a, b in (("fwd_plain", "own_plain"), ("fwd_chat", "own_chat")):
    x, y = norm(open(f"{w}/{a}").read()), norm(open(f"{w}/{b}").read())
    assert x == y, (a, x, y)
PY
    ok "cluster_forward: through node 2 (standby): completion, stream and chat == node 1's own answers (less id, created and cached tokens), text == strata generate --temp 0"
else
    not_ok "cluster_forward: answers through node 2 ($c1 $c2 $c3) differ: $(head -c 400 "$W/fwd_plain") | $(head -c 400 "$W/fwd_stream")"
fi

# ---- 2. metrics and the log say where they went
f21=$(metric 2 'strata_forwarded_requests_total{to="1"}')
r1=$(metric 1 strata_forwarded_received_total)
ok1=$(metric 1 'strata_requests_total{outcome="length"}')
if [ "$f21" -ge 3 ] && [ "$r1" -ge 3 ] && [ "$ok1" -ge 6 ] && grep -q "forwarded to node 1 at 10.77.0.1:8080" "$W/n2.err"; then
    ok "cluster_forward: node 2 /metrics forwarded_requests_total{to=\"1\"} $f21, node 1 received $r1 forwarded and finished $ok1 (with its own); node 2's log names node 1"
else
    not_ok "cluster_forward: metrics: node 2 forwarded $f21, node 1 received $r1, finished $ok1; log: $(grep route "$W/n2.err" | tail -n 3)"
fi

# What a hop costs (reported, never a pass criterion): the median time of one-token completions
# asked of node 1 directly and through node 2.
median_ms() { # median_ms N: 11 one-token completions to node N
    local i
    for i in $(seq 1 11); do
        in_ns "$1" curl -s -m 20 -o /dev/null -w '%{time_total}\n' "http://10.77.0.$1:8080/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Once","max_tokens":1,"temperature":0}'
    done | sort -n | sed -n 6p | awk '{ printf "%.1f", $1 * 1000 }'
}
echo "# one-token completion, median of 11: node 1 directly $(median_ms 1) ms, through node 2 $(median_ms 2) ms (node 1 sleeps 40 ms a step)"

# ---- 3. a client's X-Strata-Forwarded means nothing; node 2's own answers to bad requests
# (a request already forwarded is never forwarded again: only on a member's channel, which
# tests/unit/test_relay.c drives)
before=$(metric 2 'strata_forwarded_requests_total{to="1"}')
recv0=$(metric 1 strata_forwarded_received_total)
c=$(post 2 /v1/completions "$CMPL" "$W/marked" -H 'X-Strata-Forwarded: 9')
c=$c$(post 1 /v1/completions "$CMPL" "$W/marked1" -H 'X-Strata-Forwarded: 9')
after=$(metric 2 'strata_forwarded_requests_total{to="1"}')
recv1=$(metric 1 strata_forwarded_received_total)
cb=$(post 2 /v1/completions '{"prompt":' "$W/bad")
if [ "$c" = 200200 ] && [ "$after" = $((before + 1)) ] && [ "$recv1" = $((recv0 + 1)) ] &&
    [ "$cb" = 400 ] && grep -q '"error"' "$W/bad" &&
    [ "$(metric 2 'strata_forwarded_requests_total{to="1"}')" = "$after" ] &&
    cmp -s <(python3 -c "import json; print(json.load(open('$W/marked'))['choices'][0]['text'])") \
        <(python3 -c "import json; print(json.load(open('$W/own_plain'))['choices'][0]['text'])"); then
    ok "cluster_forward: a client's X-Strata-Forwarded is ignored: node 2 forwarded it anyway ($before -> $after, same text), node 1 counted only that one as received ($recv0 -> $recv1); bad JSON gets node 2's 400"
else
    not_ok "cluster_forward: client header/bad request: marked -> $c (forwards $before -> $after, node 1 received $recv0 -> $recv1), bad -> $cb $(cat "$W/bad")"
fi

# ---- 3b. the path: sealed channels to node 1's control port, kept between requests
api_conns=$(in_ns 2 ss -tanH "dst 10.77.0.1:8080" | wc -l)
opened=$(metric 2 strata_forward_channels_opened_total)
reused=$(metric 2 strata_forward_channels_reused_total)
fwds=$(metric 2 'strata_forwarded_requests_total{to="1"}')
if [ "$api_conns" = 0 ] && [ "$reused" -ge 1 ] && [ "$opened" -lt "$fwds" ]; then
    ok "cluster_forward: node 2 never connected to node 1's API (0 connections to :8080, any state): $fwds requests over $opened sealed channels, $reused reused"
else
    not_ok "cluster_forward: forward path: $api_conns connections to node 1's API, $fwds forwarded over $opened channels ($reused reused): $(in_ns 2 ss -tanH)"
fi

# ---- 3c. the channel by hand: with the key, node 1's answer; with another key, nothing
FWD_REQ="POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Strata-Forwarded: 99\r\nConnection: close\r\nContent-Length: ${#CMPL}\r\n\r\n$CMPL"
printf "$FWD_REQ" | in_ns 3 build/tools/fwd_probe "$W/key" 10.77.0.1:7100 >"$W/probe" 2>"$W/probe.err"
prc=$?
fab_key "$W/otherkey"
ref0=$(metric 1 strata_cluster_refused_total)
req0=$(metrics 1 | awk '$1 ~ /^strata_requests_total/ { s += $2 } END { print s + 0 }')
recv0=$(metric 1 strata_forwarded_received_total)
printf "$FWD_REQ" | in_ns 3 build/tools/fwd_probe "$W/otherkey" 10.77.0.1:7100 >"$W/probe_bad" 2>"$W/probe_bad.err"
brc=$?
sleep 0.3
ref1=$(metric 1 strata_cluster_refused_total)
req1=$(metrics 1 | awk '$1 ~ /^strata_requests_total/ { s += $2 } END { print s + 0 }')
recv1=$(metric 1 strata_forwarded_received_total)
if [ $prc = 0 ] && python3 - "$W" <<'PY' && [ $brc = 3 ] && [ ! -s "$W/probe_bad" ] &&
import json, sys
w = sys.argv[1]
raw = open(f"{w}/probe", newline="").read()
head, _, body = raw.partition("\r\n\r\n")
assert head.startswith("HTTP/1.1 200"), head
want = open(f"{w}/gen", "rb").read().decode()[len("Once upon a time"):-1]
assert json.loads(body)["choices"][0]["text"] == want
PY
    [ "$ref1" -gt "$ref0" ] && [ "$req1" = "$req0" ] && [ "$recv1" = "$recv0" ]; then
    ok "cluster_forward: a forward channel with the key gets node 1's exact greedy text; with another key: refused ($(head -c 120 "$W/probe_bad.err")), node 1 counted the refusal ($ref0 -> $ref1) and served nothing ($req0 requests, $recv0 received as forwarded, unchanged)"
else
    not_ok "cluster_forward: channel by hand: key -> rc $prc $(head -c 200 "$W/probe") $(cat "$W/probe.err"); other key -> rc $brc $(cat "$W/probe_bad.err"), refused $ref0 -> $ref1, requests $req0 -> $req1, received $recv0 -> $recv1"
fi

# ---- 4. an empty member (no model) answers by forwarding
fab_bg 3 "$W/n3" "$STRATA" serve --host 10.77.0.3 --node-id 3 --raft-dir "$W/raft3" \
    --fabric tcp --listen 10.77.0.3:7200 --cluster-addr 10.77.0.3:7100 "${COMMON[@]}"
PID[3]=$FAB_LAST
if until_true 20 3 "node(3) is not None and node(3)['alive'] and engine(1)"; then
    c=$(post 3 /v1/completions "$CMPL" "$W/empty_plain")
    c=$c$(post 3 /v1/completions "$STRM" "$W/empty_stream" -N)
    if [ "$c" = 200200 ] && python3 -c "
import json, sys
a = json.load(open('$W/empty_plain'))['choices'][0]['text']
b = json.load(open('$W/own_plain'))['choices'][0]['text']
ev = [e[6:] for e in open('$W/empty_stream').read().split('\n\n') if e.startswith('data: ')]
s = ''.join(json.loads(e)['choices'][0]['text'] for e in ev[:-1])
assert a == b == s and ev[-1] == '[DONE]', (a, b, s)" &&
        [ "$(metric 3 'strata_forwarded_requests_total{to="1"}')" -ge 2 ]; then
        ok "cluster_forward: empty member node 3 (no model) forwards to node 1: the same text, plain and streamed"
    else
        not_ok "cluster_forward: empty member node 3 answered $c: $(head -c 300 "$W/empty_plain")"
    fi
    TOK='{"content":"Once upon a time","with_pieces":true,"add_special":true}'
    c=$(post 3 /tokenize "$TOK" "$W/tok3")$(post 1 /tokenize "$TOK" "$W/tok1")
    c=$c$(post 3 /detokenize '{"tokens":[1,403,407]}' "$W/detok3")
    if [ "$c" = 200200200 ] && cmp -s "$W/tok3" "$W/tok1" && grep -q '"id":1,"piece":"<s>"' "$W/tok3" &&
        [ "$(cat "$W/detok3")" = '{"content":"<s> Once upon"}' ]; then
        ok "cluster_forward: /tokenize and /detokenize through the empty member: node 1's exact answers"
    else
        not_ok "cluster_forward: /tokenize through node 3: $c $(head -c 200 "$W/tok3") $(cat "$W/detok3")"
    fi
else
    why="it did not join"
    kill -0 "${PID[3]}" 2>/dev/null || why="serve without -m exited: $(grep -m1 -v '^ ' "$W/n3.err")"
    not_ok "cluster_forward: the empty member node 3 did not come up ($why)"
fi
# ---- 4a. X-Strata-Route: local pins a request to the node the client reached (an operator asking
# one replica): node 1 serves it itself; the empty member answers 503 instead of relaying; a model
# the node does not serve is a 404; any other value of the header a 400
fw0=$(metric 2 'strata_forwarded_requests_total{to="1"}')
fw3=$(metrics 3 | awk '$1 ~ /^strata_forwarded_requests_total/ { s += $2 } END { print s + 0 }')
recv0=$(metric 1 strata_forwarded_received_total)
LOCAL=(-H 'X-Strata-Route: local')
p1=$(post 1 /v1/completions "$CMPL" "$W/pin1" "${LOCAL[@]}")
p3=$(post 3 /v1/completions "$CMPL" "$W/pin3" "${LOCAL[@]}")
pm=$(post 1 /v1/completions '{"model":"other","prompt":"Once","max_tokens":2}' "$W/pinm" "${LOCAL[@]}")
pv=$(post 1 /v1/completions "$CMPL" "$W/pinv" -H 'X-Strata-Route: node2')
fw1=$(metric 2 'strata_forwarded_requests_total{to="1"}')
fw31=$(metrics 3 | awk '$1 ~ /^strata_forwarded_requests_total/ { s += $2 } END { print s + 0 }')
recv1=$(metric 1 strata_forwarded_received_total)
if [ "$p1$p3$pm$pv" = 200503404400 ] && [ "$fw1" = "$fw0" ] && [ "$fw31" = "$fw3" ] &&
    [ "$recv1" = "$recv0" ] && grep -q 'X-Strata-Route: local: this node has no model' "$W/pin3" &&
    grep -q "this node serves 'stories260K', not 'other'" "$W/pinm" &&
    cmp -s <(python3 -c "import json; print(json.load(open('$W/pin1'))['choices'][0]['text'])") \
        <(python3 -c "import json; print(json.load(open('$W/own_plain'))['choices'][0]['text'])"); then
    ok "cluster_forward: X-Strata-Route: local: node 1 served it itself (same text), the empty member answered 503 rather than relay (forwarded $fw3 -> $fw31), another model 404, another value 400; nothing relayed or received"
else
    not_ok "cluster_forward: X-Strata-Route: local -> node 1 $p1, node 3 $p3 ($(head -c 200 "$W/pin3")), model $pm ($(head -c 200 "$W/pinm")), value $pv; forwarded $fw0 -> $fw1, node 3 $fw3 -> $fw31, received $recv0 -> $recv1"
fi
kill -9 "${PID[3]}" 2>/dev/null

# ---- 5. a client that goes away cancels the upstream request
LONG='{"prompt":"Once upon a time","max_tokens":200,"ignore_eos":true,"temperature":0,"stream":true}'
cancel0=$(metric 1 'strata_requests_total{outcome="cancelled"}')
# (ip netns exec execs curl: $! is curl itself)
ip netns exec "$(fab_ns 2)" curl -sN -m 60 "http://10.77.0.2:8080/v1/completions" \
    -H 'Content-Type: application/json' -d "$LONG" >"$W/gone" &
CL=$!
for ((i = 0; i < 100; i++)); do grep -qs '"text"' "$W/gone" && break; sleep 0.1; done
kill "$CL" 2>/dev/null
wait "$CL" 2>/dev/null
cancelled=0
for ((i = 0; i < 100; i++)); do
    cancel1=$(metric 1 'strata_requests_total{outcome="cancelled"}')
    [ "$cancel1" -gt "$cancel0" ] && cancelled=1 && break
    sleep 0.1
done
if [ $cancelled = 1 ]; then
    ok "cluster_forward: the client left a relayed stream: node 1 cancelled it ($cancel0 -> $cancel1 cancelled)"
else
    not_ok "cluster_forward: the relayed stream was not cancelled at node 1 ($cancel0 -> $cancel1)"
fi

# ---- 6. the route's target dies: mid-stream, then before the request
ip netns exec "$(fab_ns 2)" curl -sN -m 60 -w '\nHTTP %{http_code} in %{time_total} s\n' \
    "http://10.77.0.2:8080/v1/completions" -H 'Content-Type: application/json' -d "$LONG" >"$W/dying" &
CL=$!
for ((i = 0; i < 100; i++)); do grep -qs '"text"' "$W/dying" && break; sleep 0.1; done
kill -9 "${PID[1]}"
wait "$CL"
rc=$?
if [ $rc = 0 ] && python3 - "$W/dying" <<'PY'; then
import json, sys
t = open(sys.argv[1]).read()
body, _, status = t.rpartition("\nHTTP ")
ev = [b[6:] for b in body.split("\n\n") if b.startswith("data: ")]
assert status.startswith("200"), status
assert ev[-1] == "[DONE]", ev[-2:]
err = json.loads(ev[-2])["error"]
assert "node 1" in err["message"], err
assert all("choices" in json.loads(e) for e in ev[:-2]), "a token event after the error"
PY
    ok "cluster_forward: node 1 killed mid-stream: the client got $(grep -c '"text"' "$W/dying") token events, then an error event naming node 1, [DONE], the end ($(tail -n 1 "$W/dying"))"
else
    not_ok "cluster_forward: node 1 killed mid-stream: curl rc $rc: $(tail -c 400 "$W/dying")"
fi
# A request that never started on the dead node is not lost: node 2 cannot connect to node 1,
# routes around it and (the standby holds the model) serves it itself, with the same text.
t0=$(date +%s%N)
c=$(post 2 /v1/completions "$CMPL" "$W/dead" -m 20)
t1=$(date +%s%N)
if [ "$c" = 200 ] && python3 -c "
import json
want = open('$W/gen', 'rb').read().decode()[len('Once upon a time'):-1]
got = json.load(open('$W/dead'))['choices'][0]['text']
assert got == want, (got, want)" &&
    grep -q "node 1 cannot be reached: asking the route again" "$W/n2.err"; then
    ok "cluster_forward: a request to node 2 whose route target (node 1) is dead is not lost: node 1 unreachable, routed again, served by node 2 with the same text in $(((t1 - t0) / 1000000)) ms"
else
    not_ok "cluster_forward: request to a dead target: $c $(cat "$W/dead") $(grep route "$W/n2.err" | tail -n 2)"
fi
exit $fail
