#!/bin/bash
# Trust on the control plane: three `strata serve --cluster` processes on 127.0.0.1 without an
# API key (node 1 serves the tiny model on the TCP fabric, nodes 2 and 3 are empty members).
#   - signed: POST /v1/cluster/recover unsigned is refused (403, the reason says a signature is
#     needed); signed with the cluster key (tests/lib/sign_request.py, written apart from the C
#     code) it passes authentication (409 here: a leader is seen); the same request again is a
#     replay (403), one 60 s old is outside the skew (403), one signed for node 2 does nothing on
#     node 1 (403), `strata cluster recover` with another key is refused (403, exit 1); nothing
#     changes (same leader, same voters);
#   - identity: a control connection that proved node 9 in its handshake is answered as node 9,
#     and refused when its OPEN or a load report then claims node 2 (counted: impostor_messages);
#   - stop: a node that forwarded requests over pooled channels stops on SIGTERM within the
#     grace period (it used to wait forever for those channels);
#   - recover: nodes 2 and 3 are killed; `strata cluster recover --key-file K --voters 1` (no
#     --node: the CLI asks /v1/cluster) makes node 1 the leader of a one-voter configuration;
#   - secrets: the cluster key (hex either case, base64, raw bytes) appears in no node's log,
#     /v1/cluster, /metrics, /health or /proc/PID/cmdline.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_trust
HB=100
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12)),3@127.0.0.1:$((CL_BASE + 13))"
node() { # node N ARGS...
    local n=$1
    shift
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((10 * HB)) "$@"
}
node 1 -m "$CL_MODEL" && node 2 && node 3 && cl_ready n1 30 &&
    cl_until 30 n1 "d['leader'] is not None and len(d['voters']) == 3" ||
    { echo "not ok - cluster_trust: no cluster: $(cl_why n1) $(cl_why n2) $(cl_why n3)"; exit 1; }
U1=${CL_URL[n1]}
BODY='{"voters":[1]}'
RPATH=/v1/cluster/recover
post() { # post FILE [CURL ARGS]: prints the status, the body in FILE
    local f=$1
    shift
    curl -s -m 30 -o "$f" -w '%{http_code}' "$U1$RPATH" -d "$BODY" "$@"
}
has() { python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['error']['message']; sys.exit(sys.argv[2] not in m)" "$1" "$2" 2>/dev/null; }
# a refused recover leaves the voters as they were (not the leader and term: an election under a
# loaded host's stall moves them, and a recover that went through would change the voters)
before=$(cl_q n1 "d['voters']")

# ---- signed
sig=$(python3 tests/lib/sign_request.py "$W/key" 1 $RPATH "$BODY")
old=$(python3 tests/lib/sign_request.py "$W/key" 1 $RPATH "$BODY" $(($(date +%s%3N) - 60000)))
for2=$(python3 tests/lib/sign_request.py "$W/key" 2 $RPATH "$BODY")
cl_key "$W/otherkey"
c_none=$(post "$W/none.json")
c_sig=$(post "$W/sig.json" -H "X-Strata-Signature: $sig")
c_replay=$(post "$W/replay.json" -H "X-Strata-Signature: $sig")
c_old=$(post "$W/old.json" -H "X-Strata-Signature: $old")
c_for2=$(post "$W/for2.json" -H "X-Strata-Signature: $for2")
c_body=$(curl -s -m 30 -o "$W/body.json" -w '%{http_code}' "$U1$RPATH" -d '{"voters":[1],"force":true}' -H "X-Strata-Signature: $(python3 tests/lib/sign_request.py "$W/key" 1 $RPATH "$BODY")")
"$STRATA" cluster recover --key-file "$W/otherkey" --voters 1 --api "${U1#http://}" >"$W/cli_bad.out" 2>&1
c_cli=$?
after=$(cl_q n1 "d['voters']")
if [ "$c_none" = 403 ] && has "$W/none.json" "must be signed with the cluster key" &&
    [ "$c_sig" = 409 ] && [ "$c_replay" = 403 ] && has "$W/replay.json" "replayed" &&
    [ "$c_old" = 403 ] && has "$W/old.json" "behind this node's clock" &&
    [ "$c_for2" = 403 ] && has "$W/for2.json" "signed for node 2, this is node 1" &&
    [ "$c_body" = 403 ] && has "$W/body.json" "MAC does not verify" &&
    [ $c_cli = 1 ] && grep -q "MAC does not verify" "$W/cli_bad.out" && [ "$before" = "$after" ]; then
    ok "cluster_trust: signed: unsigned 403 (a signature is needed), signed 409 (authenticated; a leader is seen), replayed 403, 60 s old 403, for node 2 403, another body 403, another key 403 (CLI exit 1); voters unchanged $after"
else
    not_ok "cluster_trust: signed: unsigned $c_none, signed $c_sig, replay $c_replay, old $c_old, for node 2 $c_for2, body $c_body, cli $c_cli ($(head -c 300 "$W/cli_bad.out")); $before -> $after; $(cat "$W/none.json" "$W/sig.json")"
fi

# ---- identity
CTL1=127.0.0.1:$((CL_BASE + 11))
i0=$(cl_q n1 "d['impostor_messages']")
p_self=$(build/tools/ctl_probe "$W/key" $CTL1 9 9)
p_open=$(build/tools/ctl_probe "$W/key" $CTL1 9 2)
p_load=$(build/tools/ctl_probe "$W/key" $CTL1 9 9 2)
p_key=$(build/tools/ctl_probe "$W/otherkey" $CTL1 9 9)
i1=$(cl_q n1 "d['impostor_messages']")
if [ "$p_self" = answered ] && [[ "$p_open" == closed* ]] && [[ "$p_load" == closed* ]] &&
    [[ "$p_key" == "handshake failed"* ]] && [ $((i1 - i0)) = 2 ] &&
    grep -q "OPEN in the name of node 2 from node 9" "$W/n1.log" &&
    grep -q "node 9 sent a load report in the name of node 2" "$W/n1.log"; then
    ok "cluster_trust: identity: node 9 (proved) answered; its OPEN as node 2 and its load report as node 2 refused ($p_load), counted ($i0 -> $i1); another key fails the handshake"
else
    not_ok "cluster_trust: identity: self '$p_self', open '$p_open', load '$p_load', key '$p_key', impostors $i0 -> $i1"
fi

# ---- stop: a node whose front keeps forward channels in its pool stops on SIGTERM (its control
# loop used to wait for those channels, which the front closes only after it)
for i in 1 2 3 4 5; do
    curl -s -m 20 -o /dev/null "${CL_URL[n3]}/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":4,"temperature":0}'
done
fwd=$(curl -s "${CL_URL[n3]}/metrics" | awk '$1 ~ /^strata_forwarded_requests_total/ { s += $2 } END { print s + 0 }')
t0=$(date +%s%N)
kill -TERM "${CL_PID[n3]}"
for ((i = 0; i < 150; i++)); do kill -0 "${CL_PID[n3]}" 2>/dev/null || break; sleep 0.1; done
wait "${CL_PID[n3]}" 2>/dev/null
st=$?
ms=$((($(date +%s%N) - t0) / 1000000))
if [ "$fwd" -ge 5 ] && [ $st = 0 ] && [ $ms -lt 8000 ] && grep -q "strata serve: stopped" "$W/n3.log"; then
    ok "cluster_trust: stop: node 3 forwarded $fwd requests over pooled channels and stopped on SIGTERM in $ms ms (status 0)"
else
    not_ok "cluster_trust: stop: forwarded $fwd, exit status $st after $ms ms: $(cl_why n3)"
fi

# ---- recover through the CLI, signed
cl_kill n2
cl_kill n3
sleep 3
"$STRATA" cluster recover --key-file "$W/key" --voters 1 --api "${U1#http://}" >"$W/cli.out" 2>&1
c_rec=$?
if [ $c_rec = 0 ] && grep -q '"status":"recovered"' "$W/cli.out" &&
    cl_until 20 n1 "d['leader'] == 1 and d['voters'] == [1] and d['recoveries'] == 1"; then
    ok "cluster_trust: recover: nodes 2, 3 killed; strata cluster recover (signed) made node 1 the leader of voters [1]"
else
    not_ok "cluster_trust: recover: exit $c_rec: $(head -c 400 "$W/cli.out"); $(cl_q n1 "(d['leader'], d['voters'], d['recoveries'])")"
fi

# ---- secrets
curl -s "$U1/v1/cluster" >"$W/resp_cluster"
curl -s "$U1/metrics" >"$W/resp_metrics"
curl -s "$U1/health" >"$W/resp_health"
cat /proc/"${CL_PID[n1]}"/cmdline 2>/dev/null | tr '\0' ' ' >"$W/resp_cmdline"
leak=$(python3 - "$W" <<'PY'
import base64, glob, os, sys
w = sys.argv[1]
k = bytes.fromhex(open(os.path.join(w, "key")).read().strip())
forms = {"hex": k.hex().encode(), "HEX": k.hex().upper().encode(), "base64": base64.b64encode(k),
         "base64url": base64.urlsafe_b64encode(k), "raw": k,
         "hex half": k.hex()[:32].encode(), "base64 half": base64.b64encode(k)[:21]}
files = glob.glob(os.path.join(w, "n*.log")) + glob.glob(os.path.join(w, "resp_*")) + \
    glob.glob(os.path.join(w, "*.json")) + glob.glob(os.path.join(w, "cli*.out"))
found = [f"{os.path.basename(f)}: {n}" for f in files for n, b in forms.items() if b in open(f, "rb").read()]
print("; ".join(found) if found else f"none in {len(files)} files")
PY
)
if [[ "$leak" == none* ]]; then
    ok "cluster_trust: secrets: the cluster key (hex, HEX, base64, base64url, raw, halves) is in no log, response or command line ($leak)"
else
    not_ok "cluster_trust: secrets: the key leaks: $leak"
fi
exit $fail
