#!/bin/bash
# A serving node pulls its model from the fabric (strata serve --peers, no -m) on 127.0.0.1:
# - pull_exact: while the weights arrive /health reports per-layer progress (503 until the
#   header has verified and the helper is connected, then 200 "partial"), then 200 "ready"; the
#   joiner's greedy text is the source's, and /metrics has the per-layer series;
# - partial_exact: a completion asked while partial (the source runs the missing layers and the
#   head, and the embedding too while it has not arrived: token ids go over) is the source's
#   exact text; how many rows went as token ids is reported (timing decides it);
# - chain: source -> joiner (--listen) -> second joiner, exact text at the end of the chain;
# - resume: the source is killed mid-stream, the joiner resumes from the second holder, exact;
# - other_model: a holder of another model on the way is skipped with a log line naming it;
# - repacked: a Q4_K_M model's source, joiner and chained joiner run from the 16-row layouts of a
#   node that loaded the file (the same matrices) and give its text;
# - wrong_key: a joiner without the cluster key exits 1 with a line saying it was refused (and the
#   source keeps serving its own clients).
set -u
cd "$(dirname "$0")/../.."
. tests/lib/cluster.sh
. tests/lib/serve.sh
[ -x "$STRATA" ] || { echo "not ok - cluster_pull: $STRATA not built"; exit 1; }
W=$(mktemp -d /tmp/cluster_pull.XXXXXX)
trap 'cl_cleanup; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
serve_model || { echo "not ok - cluster_pull: cannot convert the tiny model"; exit 1; }
M=$SERVE_MODEL
cl_key "$W/key"
cl_key "$W/badkey"
P="Once upon a time"
N=24
FAB=(--fabric tcp --key-file "$W/key")

why() { # the last lines of a node's log, for failure messages
    tail -n 4 "$W/$1.log" | tr '\n' '|'
}

# --- reference text: the source serving alone
cl_serve src -m "$M" "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 1)) --weight-rate 0.1 &&
    cl_ready src 20 || { echo "not ok - cluster_pull: the source did not start: $(why src)"; exit 1; }
REF=$(cl_complete src "$P" $N)
[ -n "$REF" ] || { echo "not ok - cluster_pull: no reference text: $(why src)"; exit 1; }

# --- pull_exact: progress, a completion while partial (the source helps), then ready
cl_serve j "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 1))
: >"$W/health"
asked=0
for ((i = 0; i < 600; i++)); do
    code=$(curl -s -m 2 -o "$W/h1" -w '%{http_code}' "${CL_URL[j]}/health")
    echo "$code $(cat "$W/h1")" >>"$W/health"
    st=$(sed -n 's/.*"state":"\([a-z]*\)".*/\1/p' "$W/h1")
    if [ "$code" = 200 ] && [ "$st" = partial ] && [ $asked = 0 ]; then
        cl_complete j "$P" $N >"$W/partial.txt" &
        asked=$!
    fi
    [ "$code" = 200 ] && [ "$st" = ready ] && break
    sleep 0.05
done
[ $asked != 0 ] && wait $asked
seen=$(python3 - "$W/health" <<'PY'
import json, sys
loading = partial = ready = 0
for line in open(sys.argv[1]):
    code, _, body = line.partition(" ")
    try:
        h = json.loads(body)
    except ValueError:
        continue
    if code == "503" and h.get("state") in ("loading", "partial") and \
            h["layers_resident"] < h["layers_total"]:
        loading += 1
    if code == "200" and h.get("state") == "partial" and h["layers_resident"] < h["layers_total"]:
        partial += 1
    if code == "200" and h.get("state") == "ready" and h["layers_resident"] == h["layers_total"]:
        ready += 1
print(loading, partial, ready)
PY
)
read -r n_loading n_partial n_ready <<<"$seen"
TXT=$(cl_complete j "$P" $N)
MET=$(curl -s "${CL_URL[j]}/metrics")
if [ "$n_loading" -lt 1 ] && [ "$n_partial" -lt 1 ]; then
    not_ok "pull_exact: /health never showed per-layer progress ($(tail -n 2 "$W/health"))"
elif [ "$n_ready" -lt 1 ]; then
    not_ok "pull_exact: /health never turned 200 ready: $(why j)"
elif [ "$TXT" != "$REF" ]; then
    not_ok "pull_exact: joiner text '$TXT' differs from the source's '$REF'"
elif ! grep -q '^strata_layers_resident 5$' <<<"$MET" ||
    ! grep -q '^strata_span_resident_seconds{span="6"} [0-9.]*[1-9]' <<<"$MET" ||
    ! grep -q '^strata_weights_state{state="ready"} 1$' <<<"$MET"; then
    not_ok "pull_exact: /metrics lacks the layer series"
else
    ok "pull_exact ($n_loading answers 503 with progress, $n_partial 200 partial, exact text once complete)"
fi
if [ $asked = 0 ]; then
    not_ok "partial_exact: the joiner never served while partial ($(grep -c . "$W/health") /health answers)"
elif [ "$(cat "$W/partial.txt")" != "$REF" ]; then
    not_ok "partial_exact: text served while partial '$(cat "$W/partial.txt")' differs from '$REF'"
else
    ids=$(awk '$1 == "strata_coop_token_rows_total" {print $2}' <<<"$MET")
    ok "partial_exact (a completion asked while partial, helped by the source: exact text; ${ids:-?} rows sent as token ids before the embedding arrived)"
fi
cl_stop j || not_ok "pull_exact: joiner exit status $? on SIGTERM"

# --- chain: src -> c1 -> c2
cl_serve c1 "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 1)) --listen 127.0.0.1:$((CL_BASE + 2))
# c1 is itself a joiner and helps nobody: c2 waits for every layer (its helper would be c1).
cl_serve c2 "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 2)) --stop-the-world
if ! cl_ready c2 40; then
    not_ok "chain: the end of the chain never became ready: $(why c2)"
elif [ "$(cl_complete c2 "$P" $N)" != "$REF" ]; then
    not_ok "chain: text at the end of the chain differs"
elif ! grep -q "joined" "$W/c1.log"; then
    not_ok "chain: c2 did not pull from c1"
else
    ok "chain (source -> joiner -> joiner, exact text)"
fi
cl_kill c1
cl_kill c2

# --- resume and other_model: peers s1 (paced, killed mid-stream), x (another model), s2;
# stop-the-world: the helper (s1) dies on purpose here (coop's own tests cover a dying helper).
SM=$W/other.gguf
build/tools/synth_model --shape tiny-gqa --type q8_0 --seed 3 -o "$SM" >/dev/null 2>&1 ||
    "$STRATA" convert --tokenizer "${STRATA_SHARED:-../shared}/models/tok512.bin" \
        "${STRATA_SHARED:-../shared}/models/stories260K.bin" "$SM" >/dev/null 2>&1
cl_serve s1 -m "$M" "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 3)) --weight-rate 0.15
cl_serve x -m "$SM" --name other "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 4))
cl_serve s2 -m "$M" "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 5))
cl_ready s1 20 && cl_ready x 20 && cl_ready s2 20 || not_ok "resume: holders did not start"
cl_serve r "${FAB[@]}" --stop-the-world --peers 127.0.0.1:$((CL_BASE + 3)),127.0.0.1:$((CL_BASE + 4)),127.0.0.1:$((CL_BASE + 5))
for ((i = 0; i < 200; i++)); do
    grep -q '2/5 layers resident' "$W/r.log" && break
    sleep 0.05
done
grep -q '2/5 layers resident' "$W/r.log" || not_ok "resume: no layer arrived from the first holder: $(why r)"
cl_kill s1
if ! cl_ready r 40; then
    not_ok "resume: the joiner never became ready after its source died: $(why r)"
elif [ "$(cl_complete r "$P" $N)" != "$REF" ]; then
    not_ok "resume: text differs after the resume"
elif ! grep -q "resuming from 127.0.0.1:$((CL_BASE + 5))" "$W/r.log"; then
    not_ok "resume: did not resume from the third holder: $(why r)"
else
    ok "resume (source killed mid-stream, resumed from another holder, exact text)"
fi
# The holder of another model refuses the join (the joiner names its model); a joiner that meets
# one before it knows its model is refused at the manifest (test_stream_loader, weight_stream).
if grep -q "asks for another model than ours" "$W/x.log" &&
    grep -q "upstream 127.0.0.1:$((CL_BASE + 4)) lost" "$W/r.log"; then
    ok "other_model (the holder of another model refused the join: $(grep -o 'asks for another model[^;]*' "$W/x.log" | head -n1))"
else
    not_ok "other_model: no log line about the holder of another model: $(why r)"
fi
cl_kill r

# --- repacked: a quantized model (Q4_K_M: Q4_K and Q6_K, 16-row multiples) is run from the CPU
# engine's 16-row layouts by the source (after taking its CRCs), by a joiner (each span as it
# lands) and by a joiner pulling from it (GGUF's bytes sent back from the rewritten spans): the
# same matrices as a node that loaded the file without the fabric, the same text.
QM=$W/q4km.gguf
if ! build/tools/synth_model --shape tiny-gqa --preset Q4_K_M --seed 11 --output-scale 4 \
    -o "$QM" >/dev/null 2>&1; then
    not_ok "repacked: synth_model failed"
else
    cl_serve qa -m "$QM"
    cl_serve qs -m "$QM" "${FAB[@]}" --listen 127.0.0.1:$((CL_BASE + 6))
    cl_ready qa 20 && cl_ready qs 20 || not_ok "repacked: the file-loaded nodes did not start"
    QREF=$(cl_complete qa "$P" $N)
    cl_serve q1 "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 6)) --listen 127.0.0.1:$((CL_BASE + 7)) \
        --stop-the-world
    cl_serve q2 "${FAB[@]}" --peers 127.0.0.1:$((CL_BASE + 7)) --stop-the-world
    n_file=$(sed -n 's/.*engine: \([0-9]*\) matrices stored in 16-row groups.*/\1/p' "$W/qa.log")
    if ! cl_ready q1 40 || ! cl_ready q2 40; then
        not_ok "repacked: the joiners never became ready: $(why q1) $(why q2)"
    elif [ -z "$QREF" ] || [ "$(cl_complete qs "$P" $N)" != "$QREF" ] ||
        [ "$(cl_complete q1 "$P" $N)" != "$QREF" ] || [ "$(cl_complete q2 "$P" $N)" != "$QREF" ]; then
        not_ok "repacked: text differs from the file-loaded node's '$QREF'"
    elif [ -z "$n_file" ] ||
        ! grep -q ": $n_file matrices stored in 16-row groups .*peers receive GGUF's layout" "$W/qs.log" ||
        ! grep -q ": $n_file matrices stored in 16-row groups .* as they landed" "$W/q1.log" ||
        ! grep -q ": $n_file matrices stored in 16-row groups .* as they landed" "$W/q2.log" ||
        ! grep -q "joined" "$W/q1.log"; then
        not_ok "repacked: not every node stored the file-loaded node's ${n_file:-?} matrices in 16-row groups"
    else
        ok "repacked (Q4_K_M: source, joiner and the joiner behind it store the $n_file matrices a file-loaded node does in 16-row groups; the same text)"
    fi
    cl_kill q2
    cl_kill q1
    cl_kill qs
    cl_kill qa
fi

# --- wrong_key
cl_serve bad --fabric tcp --key-file "$W/badkey" --peers 127.0.0.1:$((CL_BASE + 5))
rc=0
for ((i = 0; i < 300; i++)); do
    kill -0 "${CL_PID[bad]}" 2>/dev/null || break
    sleep 0.05
done
wait "${CL_PID[bad]}"
rc=$?
if [ $rc -ne 1 ]; then
    not_ok "wrong_key: the joiner's exit status is $rc, want 1: $(why bad)"
elif ! grep -q 'refused' "$W/bad.log"; then
    not_ok "wrong_key: no line saying it was refused: $(why bad)"
elif [ "$(cl_complete s2 "$P" $N)" != "$REF" ]; then
    not_ok "wrong_key: the holder stopped serving its clients"
else
    ok "wrong_key (joiner exits 1: $(grep -o 'refused.*' "$W/bad.log" | tail -n1 | cut -c1-100))"
fi
cl_stop s2 || not_ok "holder exit status $? on SIGTERM"
exit $fail
