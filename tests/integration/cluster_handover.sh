#!/bin/bash
# Zero-loss scale-in: a replica that leaves the engine hands its running sequences to another
# (cluster/coop.h "Hand-over"), and no request fails, restarts or changes its text because of it.
# Two `strata serve --cluster` processes on 127.0.0.1, both holding the tiny model (-m), steps
# padded to 20 ms; the leader forces a scale-in every MS ms instead of planning (--test-scale-in:
# the replica with the most running sequences is scaled down naming the other as the receiver of
# its sequences, then comes back from its host copy, and so on). Meanwhile THREADS clients send
# greedy completions (streamed and not, to both nodes) and compare each with the text a lone
# server gives the same prompt.
#   - handover_load: SCALE_INS forced scale-ins (scale-downs naming a receiver, as the leaving
#     nodes' logs say they carried them out) under load, and at least one hand-over that moved
#     sequences;
#   - handover_exact: every completion answered 200 with the lone server's exact text (streamed:
#     every event, [DONE]); none failed, none differs;
#   - handover_back: sequences came back (a node that served again brought the KV of sequences
#     still running at the receiver: "come back" in its log) or ended there.
# SCALE_INS=100 by default (make test: about 1 minute here, 250-odd requests); SCALE_INS=200 is a
# 2-minute version (500-odd requests), SCALE_INS=24 a 20 s one.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
cl_begin cluster_handover
M=$CL_MODEL
SCALE_INS=${SCALE_INS:-100}
MS=${MS:-300}
THREADS=${THREADS:-4}
HB=50
PEERS="1@127.0.0.1:$((CL_BASE + 11)),2@127.0.0.1:$((CL_BASE + 12))"
COMMON=(--max-batch 8 --test-step-delay-us 20000 --state-dir off --no-slo)

# The reference: a lone server's greedy texts.
cl_serve ref -m "$M" "${COMMON[@]}" && cl_ready ref 30 ||
    { echo "not ok - cluster_handover: the lone server did not start: $(cl_why ref)"; exit 1; }
PROMPTS=("Once upon a time" "The little dog" "Lily and Ben went to the park" "One day, a big"
    "Tom had a red ball. He" "The sun was")
: >"$W/ref.txt"
for p in "${PROMPTS[@]}"; do
    t=$(curl -s -m 60 "${CL_URL[ref]}/v1/completions" \
        -d "{\"prompt\":\"$p\",\"max_tokens\":40,\"temperature\":0}") || t=""
    echo "$t" >>"$W/ref.txt"
done
cl_kill ref

for n in 1 2; do
    cl_serve "n$n" --node-id "$n" --key-file "$W/key" --fabric tcp \
        --listen "127.0.0.1:$((CL_BASE + n))" --raft-dir "$W/raft$n" --cluster "$PEERS" \
        --cluster-heartbeat-ms $HB --cluster-dead-ms $((20 * HB)) --keep-alive-ms 600000 \
        --test-scale-in "$MS" -m "$M" "${COMMON[@]}" ||
        { echo "not ok - cluster_handover: node $n did not start: $(cl_why n$n)"; exit 1; }
done
cl_until 60 n1 "d['leader'] is not None and len([n for n in d['nodes'] if n['alive']]) == 2" ||
    { echo "not ok - cluster_handover: no leader with 2 members: $(cl_why n1)"; exit 1; }


# The clients: until SCALE_INS scale-ins were forced (or 10 minutes), then a last round.
python3 - "$W" "${CL_URL[n1]}" "${CL_URL[n2]}" "$THREADS" "$SCALE_INS" "${PROMPTS[@]}" \
    >"$W/clients.txt" 2>&1 <<'PY'
import json, subprocess, sys, threading, time, urllib.request
w, u1, u2, threads, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
prompts = sys.argv[6:]
ref = [json.loads(l)["choices"][0]["text"] for l in open(w + "/ref.txt")]
lock = threading.Lock()
stat = {"sent": 0, "exact": 0, "wrong": 0, "failed": 0}
bad = []
stop = time.time() + 600


def forced():
    n = 0
    for f in ("n1.log", "n2.log"):
        n += sum(1 for l in open(w + "/" + f, errors="replace")
                 if "executing scale-down of" in l and "(its sequences to node" in l)
    return n


def one(i, url, stream):
    body = json.dumps({"prompt": prompts[i], "max_tokens": 40, "temperature": 0,
                       "stream": stream}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read().decode()
        if stream:
            events = [l[6:] for l in raw.split("\n") if l.startswith("data: ")]
            if not events or events[-1] != "[DONE]":
                return "failed", "no [DONE]: " + raw[-200:]
            text, errs = "", []
            for e in events[:-1]:
                o = json.loads(e)
                if "error" in o:
                    errs.append(o["error"])
                else:
                    text += o["choices"][0]["text"]
            if errs:
                return "failed", "error event: %s" % errs[0]
        else:
            text = json.loads(raw)["choices"][0]["text"]
        return ("exact", "") if text == ref[i] else ("wrong", "%r != %r" % (text, ref[i]))
    except Exception as e:
        return "failed", str(e)[:200]


def client(k):
    n = 0
    while time.time() < stop:
        with lock:
            if forced() >= want:
                break
        i = (k + n) % len(prompts)
        out, why = one(i, u1 if (k + n) % 2 else u2, (k + n) % 3 == 0)
        n += 1
        with lock:
            stat["sent"] += 1
            stat[out] += 1
            if out != "exact" and len(bad) < 5:
                bad.append(why)


ts = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("RESULT sent=%d exact=%d wrong=%d failed=%d forced=%d" % (
    stat["sent"], stat["exact"], stat["wrong"], stat["failed"], forced()))
for b in bad:
    print("BAD " + b)
PY
res=$(sed -n 's/^RESULT //p' "$W/clients.txt")
eval "$res" 2>/dev/null || { echo "not ok - cluster_handover: the clients: $(tail -n 3 "$W/clients.txt")"; exit 1; }
moved=$(cat "$W/n1.log" "$W/n2.log" | grep -c "coop: handed [1-9][0-9]* sequences")
seqs=$(cat "$W/n1.log" "$W/n2.log" | sed -n 's/.*coop: handed \([0-9]*\) sequences.*/\1/p' | awk '{s += $1} END {print s + 0}')
given=$(cat "$W/n1.log" "$W/n2.log" | grep -c "hand-over to .* given up")
back=$(cat "$W/n1.log" "$W/n2.log" | grep -c "come back\|no sequence of this node is left there")
if [ "$forced" -ge "$SCALE_INS" ] && [ "$moved" -gt 0 ]; then
    ok "cluster_handover: handover_load: $forced forced scale-ins under load ($sent requests), $moved moved running sequences ($seqs in all), $given given up (their sequences finished at home)"
else
    not_ok "cluster_handover: handover_load: $forced forced scale-ins (want $SCALE_INS), $moved moved sequences: $(cl_why n1)"
fi
if [ "$failed" = 0 ] && [ "$wrong" = 0 ] && [ "$exact" = "$sent" ] && [ "$sent" -gt 0 ]; then
    ok "cluster_handover: handover_exact: all $sent completions exact (the lone server's greedy text), none failed"
else
    not_ok "cluster_handover: handover_exact: $sent sent, $exact exact, $wrong wrong, $failed failed: $(grep BAD "$W/clients.txt" | head -n 3 | tr '\n' '|')"
fi
if [ "$back" -gt 0 ]; then
    ok "cluster_handover: handover_back: $back hand-overs ended (the node served again or nothing of it was left at the receiver)"
else
    not_ok "cluster_handover: handover_back: no hand-over ended: $(cl_why n1)"
fi
exit $fail
