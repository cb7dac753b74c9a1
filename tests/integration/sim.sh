#!/bin/bash
# sim: `strata sim` end to end: the Azure trace replayed under every policy with nothing but its
# defaults (which scale) writes the table, the CSV files (a summary row per policy with the spread
# over 5 seeds, a row per run, a TTFT CDF, a timeline per policy) and five PNG charts drawn by
# gnuplot; a holder failure during scale-outs is survived; a config file is read; bad input ends
# with a message naming it. About 40 s here.
set -u
cd "$(dirname "$0")/../.."
BIN=${STRATA:-build/strata}
OUT=$(mktemp -d /tmp/strata-sim-test.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
TRACE=../shared/traces/azure_llm_2023_conv.csv
if [ ! -f "$TRACE" ]; then
    echo "skip - sim: no $TRACE"
    exit 0
fi

# summary.csv's column NAME for policy P in DIR
col() { awk -F, -v p="$3" -v c="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==c) k=i} NR>1 && $1==p{print $k}' "$1/summary.csv"; }

# the defaults alone (13B on 32 H100, the trace at 10x, 5 seeds) exercise scaling
if "$BIN" sim --trace "$TRACE" --out "$OUT/run" --quiet >"$OUT/stdout" 2>"$OUT/stderr"; then
    ok "sim: trace under every policy, defaults"
else
    nok "sim: trace under every policy, defaults" "$(tail -3 "$OUT/stderr")"
fi
n_pol=$(grep -cE '^(fixed|stop-the-world|serverlessllm|lambdascale|blitzscale|tokenscale|strata) +[0-9]' "$OUT/stdout")
[ "$n_pol" = 7 ] && ok "sim: table has 7 policies" || nok "sim: table has 7 policies" "$n_pol rows"
rows=$(($(wc -l <"$OUT/run/summary.csv" 2>/dev/null || echo 0) - 1))
[ "$rows" = 7 ] && ok "sim: summary.csv has 7 rows" || nok "sim: summary.csv" "$rows rows"
runs=$(($(wc -l <"$OUT/run/runs.csv" 2>/dev/null || echo 0) - 1))
[ "$runs" = 35 ] && ok "sim: runs.csv has 7 x 5 seeds" || nok "sim: runs.csv" "$runs rows"
cdf=$(($(wc -l <"$OUT/run/ttft_cdf.csv" 2>/dev/null || echo 0) - 1))
[ "$cdf" = 200 ] && ok "sim: ttft_cdf.csv has 200 quantiles" || nok "sim: ttft_cdf.csv" "$cdf rows"
tl=$(ls "$OUT/run"/timeline_*.csv 2>/dev/null | wc -l)
[ "$tl" = 7 ] && ok "sim: a timeline per policy (the median run's)" || nok "sim: timelines" "$tl files"
for png in ttft_cdf slo_timeline gpu_time metrics tpot; do
    f="$OUT/run/$png.png"
    if [ -s "$f" ] && [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; then
        ok "sim: $png.png is a PNG"
    else
        nok "sim: $png.png is a PNG" "missing or not PNG"
    fi
done
# the bar chart draws bars, not boxes as wide as the chart (gnuplot read a 4-column boxerrorbars'
# last column as the width: 66% of the picture inked, 11-12% as bars)
ink=$(python3 tests/lib/png_ink.py "$OUT/run/gpu_time.png" 2>&1)
awk -v i="$ink" 'BEGIN{exit !(i > 0.02 && i < 0.35)}' && ok "sim: gpu_time.png draws bars ($ink of it inked)" ||
    nok "sim: gpu_time.png draws bars" "$ink of it inked"
# scaling happened: the autoscalers used more than one GPU at some point, fewer than all on average
for p in blitzscale strata; do
    g=$(col "$OUT/run" max_gpus $p) s=$(col "$OUT/run" gpu_seconds $p)
    awk -v g="$g" -v s="$s" 'BEGIN{exit !(g>1 && s<32*300)}' && ok "sim: $p scales ($g GPUs at most, $s GPU-s)" ||
        nok "sim: $p scales" "max $g GPUs, $s GPU-s"
done
# attainment is a fraction, and its spread brackets the median
att=$(col "$OUT/run" slo_attainment strata) lo=$(col "$OUT/run" slo_lo strata) hi=$(col "$OUT/run" slo_hi strata)
awk -v a="$att" -v l="$lo" -v h="$hi" 'BEGIN{exit !(a>0 && a<=1 && l<=a && a<=h)}' &&
    ok "sim: attainment $att in [$lo, $hi]" || nok "sim: attainment" "'$att' '$lo' '$hi'"

# a config file describing a 3-node cluster, with a holder failing during a scale-out burst
if "$BIN" sim --config tests/fixtures/sim/three_nodes.conf --synthetic rps=2,dur=40,burst=40,at=10,len=10,in=512,out=32 \
    --policy strata --seeds 1 --out "$OUT/three" --quiet >"$OUT/three.out" 2>&1; then
    f=$(col "$OUT/three" failures strata)
    done_="$(col "$OUT/three" done strata)/$(col "$OUT/three" requests strata)"
    n_done=${done_%/*} n_all=${done_#*/}
    [ "$f" = 1 ] && [ "$n_done" = "$n_all" ] &&
        ok "sim: holder dies mid-stream, R=2 keeps the model: $done_ requests done" ||
        nok "sim: holder failure" "failures=$f, done $done_"
else
    nok "sim: config file run" "$(tail -3 "$OUT/three.out")"
fi
# same seed, same numbers
"$BIN" sim --config tests/fixtures/sim/three_nodes.conf --synthetic rps=2,dur=40,burst=40,at=10,len=10,in=512,out=32 \
    --policy strata --seeds 2 --quiet 2>/dev/null | grep '^strata ' >"$OUT/a"
"$BIN" sim --config tests/fixtures/sim/three_nodes.conf --synthetic rps=2,dur=40,burst=40,at=10,len=10,in=512,out=32 \
    --policy strata --seeds 2 --quiet 2>/dev/null | grep '^strata ' >"$OUT/b"
[ -s "$OUT/a" ] && cmp -s "$OUT/a" "$OUT/b" && ok "sim: same seed, same table" ||
    nok "sim: same seed, same table" "$(cat "$OUT/a" "$OUT/b")"
# a fixed scenario (the live namespaces setup's shape, tests/bench/sim_validate.sh): one scale-out at
# t = 0, a request sent to the joiner; its first token comes after the first span (live) or every
# span (stop-the-world) at 10 MB/s, plus one step of 0.01 x 10 + 0.02 s
cat >"$OUT/fixed.conf" <<CONF
gpus = CPU:2
gpus_per_server = 1
gpus_per_inst = 1
model_spans = 1000000x4
nic_gbps = 0.08
latency_us = 0
step = CPU:0.01,0,0.02
planner = off
send_to = 1
live_min_layers = 1
scaleout = 0:0:1
CONF
printf 'seconds,in,out\n0,10,2\n' >"$OUT/fixed.csv"
if "$BIN" sim --config "$OUT/fixed.conf" --requests "$OUT/fixed.csv" --policy strata \
    --policy strata-stop-the-world --seeds 1 --out "$OUT/fixed" --quiet >"$OUT/fixed.out" 2>&1; then
    got="strata=$(col "$OUT/fixed" first_token_s strata)/$(col "$OUT/fixed" scaleout_max_s strata)"
    got="$got strata-stop-the-world=$(col "$OUT/fixed" first_token_s strata-stop-the-world)"
    got="$got/$(col "$OUT/fixed" scaleout_max_s strata-stop-the-world) "
    [ "$got" = "strata=0.2200/0.4000 strata-stop-the-world=0.5200/0.4000 " ] &&
        ok "sim: fixed scale-out, first token after the first span (live) / every span" ||
        nok "sim: fixed scale-out" "$got"
else
    nok "sim: fixed scale-out run" "$(tail -3 "$OUT/fixed.out")"
fi
# errors name the input
msg=$("$BIN" sim --synthetic rps=1,dur=1 --gpus B200:8 2>&1)
[ $? = 2 ] && echo "$msg" | grep -q B200 && ok "sim: unknown GPU type refused" ||
    nok "sim: unknown GPU type" "$msg"
msg=$("$BIN" sim --synthetic rps=1,dur=1 --seeds 99 2>&1)
[ $? = 2 ] && echo "$msg" | grep -q -- "--seeds: '99' is not a number in \[1, 32\]" &&
    ok "sim: --seeds out of range refused" || nok "sim: --seeds 99" "$msg"
msg=$("$BIN" sim --synthetic rps=1,dur=1 --keep-alive-s 2>&1)
[ $? = 2 ] && echo "$msg" | grep -q -- "--keep-alive-s needs a value" &&
    ok "sim: a config key without its value refused" || nok "sim: --keep-alive-s" "$msg"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,12\n' >"$OUT/bad.csv"
msg=$("$BIN" sim --trace "$OUT/bad.csv" 2>&1)
[ $? = 1 ] && echo "$msg" | grep -q "line 2" && ok "sim: bad trace line named" ||
    nok "sim: bad trace" "$msg"
printf 'seconds,in,out\n0,0,1\n' >"$OUT/bad_req.csv"
msg=$("$BIN" sim --requests "$OUT/bad_req.csv" 2>&1)
[ $? = 1 ] && echo "$msg" | grep -q "line 2" && ok "sim: bad requests line named" ||
    nok "sim: bad requests" "$msg"
exit $fail
