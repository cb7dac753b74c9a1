#!/bin/bash
# Cooperative ("zigzag") execution between two `strata serve` processes on loopback over the TCP
# fabric (docs/cluster.md): a helper holding the whole model, and a joiner that runs only layers
# [0, k) itself while k rises mid-request. Greedy and seeded output through the joiner must be
# byte-identical to the helper serving alone, for the real tiny model and a 24-layer synthetic
# one, with several concurrent requests, whether the KV of the layers that become local is
# transferred from the helper or recomputed (--coop-kv transfer|recompute; compare checks the two
# give the same bytes; all the running sequences' KV in one request, or one batched recompute), also when the joiner starts without its embedding (token ids to the
# helper); f16 and bf16 activations must agree with the helper alone up to a bound; /metrics shows the split. One
# line per scenario.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
W=$(mktemp -d /tmp/cluster_coop.XXXXXX)
trap 'serve_cleanup; rm -rf "$W"' EXIT
serve_model || { not_ok "cluster_coop: cannot convert the test model"; exit 1; }
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() { curl -s "$1/metrics" | awk -v n="$2" '$1 == n {print $2}'; }
CHECKS="python3 tests/lib/cluster_checks.py"

# helper_and_joiner NAME JOINER-ARGS...: a helper (all layers, listening on the fabric, with
# $HELPER_ARGS) and a joiner peered with it; sets HELPER_URL, JOINER_URL, HELPER_PID, JOINER_PID.
helper_and_joiner() {
    local name=$1
    shift
    local t
    for t in 1 2 3; do
        # free_port's port is free only until someone binds it: the helper's own API (--port 0)
        # may be given the same one by the kernel; then again with another
        FP=$(free_port)
        # shellcheck disable=SC2086 # HELPER_ARGS: extra helper options, split on spaces
        serve_start "$name-helper" --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v \
            ${HELPER_ARGS:-} && break
        grep -q "Address already in use" "$SERVE_LOG" && [ $t -lt 3 ] || return 1
    done
    HELPER_URL=$SERVE_URL HELPER_PID=$SERVE_PID HELPER_LOG=$SERVE_LOG
    serve_start "$name-joiner" --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v "$@" \
        || return 1
    JOINER_URL=$SERVE_URL JOINER_PID=$SERVE_PID JOINER_LOG=$SERVE_LOG
    for ((i = 0; i < 50; i++)); do
        grep -q "coop: helper .* connected" "$JOINER_LOG" && return 0
        sleep 0.1
    done
    echo "the joiner never connected to its helper" >&2
    return 1
}
stop_both() {
    SERVE_PID=$JOINER_PID SERVE_LOG=$JOINER_LOG serve_stop
    SERVE_PID=$HELPER_PID SERVE_LOG=$HELPER_LOG serve_stop
}

# 1. tiny model, greedy, k = 0 -> 1 -> 2 -> 4 -> 5 during the requests (4 concurrent, 1 streamed),
#    the KV of the layers that become local transferred, then recomputed
for kv in transfer recompute; do
    if helper_and_joiner "tiny-$kv" --resident-schedule 0:0,3:1,9:2,20:4,45:5 --coop-kv $kv; then
        if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" 2>&1); then
            ok "coop tiny greedy, k 0->1->2->4->5 mid-request, 4 concurrent, KV $kv: $out"
        else
            not_ok "coop tiny greedy, KV $kv: $out"
        fi
        steps=$(metric "$JOINER_URL" strata_coop_remote_steps_total)
        fills=$(metric "$JOINER_URL" strata_coop_fill_layers_total)
        moved=$(metric "$JOINER_URL" strata_coop_kv_layers_total)
        kvb=$(metric "$JOINER_URL" strata_coop_kv_bytes_total)
        sentb=$(metric "$HELPER_URL" strata_coop_kv_served_bytes_total)
        partial=$(metric "$JOINER_URL" strata_coop_partial_tokens_total)
        served=$(metric "$HELPER_URL" strata_coop_served_steps_total)
        k=$(metric "$JOINER_URL" strata_coop_k)
        left=$(metric "$HELPER_URL" strata_coop_remote_sequences)
        if [ $kv = transfer ]; then
            # several sequences handed over in one batch: one request, every one transferred, the
            # helper's answer in between-step windows
            batch=$(grep -o "KV of layers \[[0-9]*, [0-9]*) of [2-9] sequences ([0-9]* positions) in one request: [2-9] transferred.*" "$JOINER_LOG" | head -1)
            nb=$(echo "$batch" | sed -E 's/.* of ([0-9]) sequences .*/\1/')
            sent=$(grep -o "KV of layers \[[0-9]*, [0-9]*) of $nb sequences sent: .*" "$HELPER_LOG" | head -1)
            if [ -n "$batch" ] && [ -n "$sent" ] && echo "$batch" | grep -q ": $nb transferred.*0 refused$"; then
                ok "coop KV of $nb sequences handed over in one batch: joiner: $batch; helper: $sent"
            else
                not_ok "coop KV batch: joiner '$batch', helper '$sent'"
            fi
            how="$moved layer transfers ($kvb bytes, = the helper's $sentb), $fills recomputes"
            [ "${moved:-0}" -gt 0 ] && [ "${fills:-1}" = 0 ] && [ "${kvb:-0}" -gt 0 ] &&
                [ "$kvb" = "$sentb" ]
        else
            how="$fills layer recomputes, $moved transfers"
            [ "${fills:-0}" -gt 0 ] && [ "${moved:-1}" = 0 ]
        fi
        fine=$?
        if [ $fine = 0 ] && [ "${steps:-0}" -gt 0 ] && [ "${partial:-0}" -gt 0 ] &&
            [ "${served:-0}" = "$steps" ] && [ "$k" = 5 ] && [ "$left" = 0 ]; then
            ok "coop metrics, KV $kv: $steps remote steps (= helper's served), $partial tokens while partial, $how, k=5, helper holds 0 sequences"
        else
            not_ok "coop metrics, KV $kv: remote steps $steps, served $served, partial $partial, $how, k $k, helper holds $left"
        fi
        stop_both
    else
        not_ok "coop tiny, KV $kv: start"
    fi
done

# 1a. the batched handover spread over many of the helper's between-step windows: a window of one
#    byte (--coop-kv-window 1) lets one chunk out per window; still one request per rise, every
#    sequence transferred, the text exact
if HELPER_ARGS="--coop-kv-window 1" helper_and_joiner "tiny-window" --resident-schedule 0:1,10:3,30:5 --coop-kv transfer; then
    out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" 2>&1)
    rc=$?
    sent=$(grep -o "KV of layers \[[0-9]*, [0-9]*) of [2-9] sequences sent: [0-9]* bytes in [0-9]* chunks, [0-9]* between-step windows.*" "$HELPER_LOG" | head -1)
    chunks=$(echo "$sent" | sed -E 's/.* in ([0-9]+) chunks.*/\1/')
    windows=$(echo "$sent" | sed -E 's/.* chunks, ([0-9]+) between-step.*/\1/')
    fills=$(metric "$JOINER_URL" strata_coop_fill_layers_total)
    if [ $rc = 0 ] && [ -n "$sent" ] && [ "${windows:-0}" -gt 1 ] && [ "$windows" -ge "$chunks" ] &&
        [ "${fills:-1}" = 0 ]; then
        ok "coop KV batch in one-chunk windows: $out; helper: $sent"
    else
        not_ok "coop KV one-chunk windows: '$out', helper '$sent', $fills recomputes"
    fi
    stop_both
else
    not_ok "coop KV one-chunk windows: start"
fi

# 1b. the joiner serves before its embedding has arrived ("STEP:e" in the schedule): its first
#    steps go to the helper as token ids (the helper embeds), then the embedding arrives and k
#    rises mid-request; the positions sent as token ids get their KV recomputed from the saved
#    ids (embedding first) or transferred; the same text as the helper alone
for sched in "recompute 0:0,6:e,12:2,25:4,45:5" "transfer 0:0,10:e,10:3,30:5"; do
    read -r kv plan <<<"$sched"
    if helper_and_joiner "noemb-$kv" --resident-schedule "$plan" --coop-kv $kv; then
        remote0=$(metric "$JOINER_URL" strata_coop_embedding_remote)
        if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" 2>&1); then
            ok "coop tiny greedy, no embedding at first, then $plan mid-request, KV $kv: $out"
        else
            not_ok "coop tiny greedy without the embedding, $plan, KV $kv: $out"
        fi
        remote1=$(metric "$JOINER_URL" strata_coop_embedding_remote)
        k=$(metric "$JOINER_URL" strata_coop_k)
        ids=$(metric "$JOINER_URL" strata_coop_token_rows_total)
        rows=$(metric "$JOINER_URL" strata_coop_remote_rows_total)
        here=$(grep -c "coop: the embedding is here" "$JOINER_LOG")
        if [ "$remote0" = 1 ] && [ "$remote1" = 0 ] && [ "$k" = 5 ] && [ "$here" = 1 ] &&
            [ "${ids:-0}" -gt 0 ] && [ "${rows:-0}" -gt "${ids:-0}" ]; then
            ok "coop embedding remote, KV $kv: /metrics said so (1) before the requests, 0 after; $ids of $rows remote rows sent as token ids; k=5"
        else
            not_ok "coop embedding remote, KV $kv: embedding_remote $remote0 then $remote1, $ids of $rows rows as token ids, k $k, 'the embedding is here' logged $here times"
        fi
        stop_both
    else
        not_ok "coop tiny without the embedding, KV $kv: start"
    fi
done

# 2. seeded sampling (temperature 0.9): the sampler's state travels with the tokens
if helper_and_joiner seeded --resident-schedule 0:2,15:3,40:5 --coop-kv transfer; then
    if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --temp 0.9 --seed 11 2>&1); then
        ok "coop seeded sampling (T=0.9), k 2->3->5 mid-request, KV transferred: $out"
    else
        not_ok "coop seeded sampling: $out"
    fi
    stop_both
else
    not_ok "coop seeded: start"
fi

# 2b. a burst of long prompts, prefilled in 16-token chunks, while k rises 0 -> 1 -> 2 -> 4 -> 5:
#     with --coop-pipeline on (the default) a prompt's next chunk runs its local layers while the
#     helper still runs the last one's, two steps in flight; greedy and seeded, the same text as
#     the helper alone (and with the pipeline off, the same again)
for pipe in on off; do
    if helper_and_joiner "burst-$pipe" --step-tokens 16 --coop-pipeline $pipe \
        --resident-schedule 0:0,5:1,12:2,25:4,40:5 --coop-kv transfer; then
        if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --long 90 --n 6 --tokens 30 2>&1) &&
            out2=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --long 70 --n 5 --tokens 30 --temp 0.9 --seed 5 2>&1); then
            ok "coop burst of 6 long prompts in 16-token chunks, k 0->1->2->4->5, --coop-pipeline $pipe: greedy $out; seeded $out2"
        else
            not_ok "coop burst of long prompts, --coop-pipeline $pipe: $out ${out2:-}"
        fi
        piped=$(metric "$JOINER_URL" strata_coop_pipelined_steps_total)
        steps=$(metric "$JOINER_URL" strata_coop_remote_steps_total)
        if { [ "$pipe" = on ] && [ "${piped:-0}" -gt 0 ]; } || { [ "$pipe" = off ] && [ "${piped:-1}" = 0 ]; }; then
            ok "coop --coop-pipeline $pipe: $piped of $steps remote steps sent with the one before still in flight"
        else
            not_ok "coop --coop-pipeline $pipe: $piped of $steps remote steps pipelined"
        fi
        stop_both
    else
        not_ok "coop burst-$pipe: start"
    fi
done

# 2c. a helper whose KV pool is too small for the joiner's burst (--kv-blocks 24: 384 positions,
#     the joiner's 6 long prompts need about 900 at the helper while k = 0): the helper refuses the
#     steps it has no blocks for and the joiner has its newest sequence give way each time
#     (requeued, recomputed; closed at the helper, which frees its blocks): no request fails, and
#     the text is the helper's alone; pipelined (the refusal comes back for a step in flight, the
#     next one already sent) and not
for pipe in on off; do
    if HELPER_ARGS="--kv-blocks 24" helper_and_joiner "small-kv-$pipe" --step-tokens 16 \
        --resident-schedule 0:0,300:5 --coop-kv transfer --coop-pipeline $pipe; then
        if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --long 90 --n 6 --tokens 30 2>&1); then
            refused=$(grep -c "refused (" "$HELPER_LOG")
            gave=$(metric "$JOINER_URL" strata_num_preemptions_total)
            if [ "${refused:-0}" -gt 0 ] && [ "${gave:-0}" -gt 0 ]; then
                ok "coop helper out of KV blocks, --coop-pipeline $pipe: it refused steps, $gave sequences gave way at the joiner, none failed: $out"
            else
                not_ok "coop helper out of KV blocks, --coop-pipeline $pipe: the same text ($out) but no refusal (helper log: $refused lines, joiner preemptions: ${gave:-none})"
            fi
        else
            not_ok "coop helper out of KV blocks, --coop-pipeline $pipe: $out"
        fi
        stop_both
    else
        not_ok "coop small-kv-$pipe: start"
    fi
done

# 2d. a helper whose whole pool is smaller than one of the joiner's sequences (--kv-blocks 4: 64
#     positions, a 90-word prompt): refused each time it runs alone, the request fails with why
#     after SCHED_ALONE_REFUSALS tries instead of waiting for ever
if HELPER_ARGS="--kv-blocks 4" helper_and_joiner "tiny-kv" --step-tokens 16 \
    --resident-schedule 0:0,300:5 --coop-kv transfer; then
    prompt=$($CHECKS prompt --long 90 --n 1)
    got=$(timeout 60 curl -s "$JOINER_URL/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": $prompt, \"max_tokens\": 8}")
    if grep -q "refused 32 times running alone: helper .* refused the step: helper out of KV blocks" <<<"$got"; then
        ok "coop helper without room for one sequence: the request fails at once with why ($(grep -o 'refused 32 times[^"]*' <<<"$got" | head -c 120))"
    else
        not_ok "coop helper without room for one sequence: ${got:-no answer in 60 s}"
    fi
    stop_both
else
    not_ok "coop tiny-kv: start"
fi

# 3. f16 activations (lossy): each text agrees with the helper's alone for its first 64 bytes at
# least and 90% of the bytes overall (measured: all identical), so garbage or an early drift fails
if helper_and_joiner f16 --resident-layers 2 --coop-dtype f16; then
    if out=$($CHECKS diverge "$HELPER_URL" "$JOINER_URL" 2>&1); then
        ok "coop f16 activations at k=2 (lossy, bounded): $out"
    else
        not_ok "coop f16 activations: $out"
    fi
    stop_both
else
    not_ok "coop f16: start"
fi

# 3b. the helper's own clients beside two joiners' (one sending token ids until its embedding
#     "arrives", then k rising 1 -> 2 -> 4; the other at k = 3), all at once: the helper fuses the
#     joiners' steps into its own (--coop-fuse on, the default) or runs them apart (off); every text
#     on all three nodes is the helper's alone, byte for byte
for fuse in on off; do
    FP=$(free_port)
    if serve_start "fuse-$fuse-helper" --fabric tcp --listen "127.0.0.1:$FP" --key-file "$W/key" -v \
        --coop-fuse $fuse; then
        HELPER_URL=$SERVE_URL HELPER_PID=$SERVE_PID HELPER_LOG=$SERVE_LOG
        serve_start "fuse-$fuse-j1" --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
            --resident-schedule 0:0,15:e,15:1,30:2,80:4
        J1_URL=$SERVE_URL J1_PID=$SERVE_PID J1_LOG=$SERVE_LOG
        serve_start "fuse-$fuse-j2" --fabric tcp --peers "127.0.0.1:$FP" --key-file "$W/key" -v \
            --resident-layers 3
        J2_URL=$SERVE_URL J2_PID=$SERVE_PID J2_LOG=$SERVE_LOG
        for ((i = 0; i < 50; i++)); do
            grep -q "coop: helper .* connected" "$J1_LOG" && grep -q "coop: helper .* connected" "$J2_LOG" && break
            sleep 0.1
        done
        if out=$($CHECKS together "$HELPER_URL" "$HELPER_URL" "$J1_URL" "$J2_URL" 2>&1); then
            ok "coop helper with its own requests beside joiners at k tokens->1->2->4 and k 3, --coop-fuse $fuse: $out"
        else
            not_ok "coop helper with its own requests, --coop-fuse $fuse: $out"
        fi
        if [ $fuse = on ]; then
            if out=$($CHECKS together "$HELPER_URL" "$HELPER_URL" "$J1_URL" "$J2_URL" --temp 0.9 --seed 11 2>&1); then
                ok "coop helper with its own requests beside two joiners, fused, seeded sampling (T=0.9): $out"
            else
                not_ok "coop helper with its own requests, fused, seeded: $out"
            fi
        fi
        served=$(metric "$HELPER_URL" strata_coop_served_steps_total)
        fused=$(metric "$HELPER_URL" strata_coop_fused_steps_total)
        frows=$(metric "$HELPER_URL" strata_coop_fused_rows_total)
        late=$(metric "$HELPER_URL" strata_coop_fused_late_layers_total)
        trows=$(metric "$J1_URL" strata_coop_token_rows_total)
        if { [ $fuse = on ] && [ "${fused:-0}" -gt 0 ] && [ "$fused" -le "${served:-0}" ]; } ||
            { [ $fuse = off ] && [ "${fused:-1}" = 0 ] && [ "${served:-0}" -gt 0 ]; }; then
            ok "coop --coop-fuse $fuse: $fused of the helper's $served remote steps ($frows rows) ran inside its own ($late layers run alone by steps that came late; $trows rows came as token ids)"
        else
            not_ok "coop --coop-fuse $fuse: fused $fused of $served remote steps"
        fi
        SERVE_PID=$J1_PID SERVE_LOG=$J1_LOG serve_stop
        SERVE_PID=$J2_PID SERVE_LOG=$J2_LOG serve_stop
        SERVE_PID=$HELPER_PID SERVE_LOG=$HELPER_LOG serve_stop
    else
        not_ok "coop fuse $fuse: start"
    fi
done

# 4. a synthetic model with 24 layers, k rising one to a few layers at a time
SYN="$W/syn24.gguf"
if build/tools/synth_model --shape 64,172,24,8,4,512,256 --type f32 --seed 5 -o "$SYN" >/dev/null 2>&1; then
    SERVE_MODEL=$SYN
    # transfer, recompute, auto (the default: by measured costs), and compare (both on every
    # handover: the same bytes, checked)
    for kv in transfer recompute auto compare; do
        if helper_and_joiner "syn-$kv" --resident-schedule 0:1,2:2,4:3,6:5,9:8,13:12,18:16,25:20,33:23,50:24 --coop-kv $kv; then
            if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --tokens 60 2>&1); then
                ok "coop synthetic 24 layers, k 1->...->24 in 10 moves mid-request, KV $kv: $out"
            else
                not_ok "coop synthetic 24 layers, KV $kv: $out"
            fi
            if [ $kv = auto ]; then
                line=$(grep -m1 -o "KV of layers \[[0-9]*, [0-9]*): \(transfer\|recompute\) (.*" "$JOINER_LOG")
                moved=$(metric "$JOINER_URL" strata_coop_kv_layers_total)
                fills=$(metric "$JOINER_URL" strata_coop_fill_layers_total)
                [ -n "$line" ] && ok "coop KV auto: $moved layer transfers, $fills layer recomputes (by timing, reported); first decision: $line" ||
                    not_ok "coop KV auto: no decision in the joiner's log"
            fi
            if [ $kv = compare ]; then
                same=$(grep -c "recompute .* ms: identical bytes" "$JOINER_LOG")
                differ=$(grep -c "DIFFERENT bytes" "$JOINER_LOG")
                [ "$same" -gt 0 ] && [ "$differ" = 0 ] &&
                    ok "coop KV transferred = KV recomputed, byte for byte, on $same handovers (each of all the running sequences, batched)" ||
                    not_ok "coop KV compare: $same identical, $differ different"
            fi
            stop_both
        else
            not_ok "coop synthetic, KV $kv: start"
        fi
    done
    # no embedding at first: KV of positions sent as token ids, transferred and recomputed (the
    # embedding run here from the saved ids) on every handover, the same bytes
    if helper_and_joiner syn-noemb --resident-schedule 0:0,4:e,9:3,18:12,33:24 --coop-kv compare; then
        if out=$($CHECKS same "$HELPER_URL" "$JOINER_URL" --tokens 60 2>&1); then
            ok "coop synthetic 24 layers, no embedding until step 4, k 0->3->12->24, KV compare: $out"
        else
            not_ok "coop synthetic 24 layers without the embedding: $out"
        fi
        same=$(grep -c "recompute .* ms: identical bytes" "$JOINER_LOG")
        differ=$(grep -c "DIFFERENT bytes" "$JOINER_LOG")
        [ "$same" -gt 0 ] && [ "$differ" = 0 ] &&
            ok "coop KV of token-id positions: transferred = embedded and recomputed here, byte for byte, on $same batched handovers" ||
            not_ok "coop KV compare without the embedding: $same identical, $differ different"
        stop_both
    else
        not_ok "coop synthetic without the embedding: start"
    fi
    # bf16 activations (8 bits of mantissa) halfway up 24 layers: bounded as f16's
    if helper_and_joiner synbf16 --resident-layers 12 --coop-dtype bf16; then
        if out=$($CHECKS diverge "$HELPER_URL" "$JOINER_URL" --tokens 60 2>&1); then
            ok "coop synthetic 24 layers, bf16 activations at k=12 (lossy, bounded): $out"
        else
            not_ok "coop synthetic bf16 activations: $out"
        fi
        stop_both
    else
        not_ok "coop synthetic bf16: start"
    fi
else
    not_ok "coop synthetic: synth_model failed"
fi
exit $fail
