#!/bin/bash
# sim_headline: the headline figures of docs/simulator.md and the README, asserted, not only
# printed: Strata against faithful BlitzScale on 32 H100 with 13B (the two Azure traces at 10x and
# the synthetic bursty trace) and on 256 H100 with 70B (12x, and the bursts at twice the rate),
# medians over 5 seeds (tests/bench/sim_compare.sh's six tables); placement by the throughput
# matrix against ignoring it on A100 x16 + H100 x16; and the failure run (a holder dies mid
# scale-out: R = 2 serves 443 of 443, BlitzScale's one copy 18). The simulator is deterministic,
# so the figures are exact on any machine; the tolerances (3 points of P99 change, 1 point of
# attainment, 1 point of GPU-seconds, 3% of each P99) let a small model change through and catch
# a policy's behaviour changing. About 50 s of CPU; the eight runs go one per core (--no-charts:
# sim.sh checks the charts), then are judged in order.
set -u
cd "$(dirname "$0")/../.."
BIN=${STRATA:-build/strata}
OUT=$(mktemp -d /tmp/strata-sim-headline.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail=0
ok() { echo "ok - $1"; }
nok() { echo "not ok - $1: $2"; fail=1; }
T=../shared/traces
if [ ! -f "$T/azure_llm_2023_conv.csv" ]; then
    echo "skip - sim_headline: no $T"
    exit 0
fi
# launch NAME ARGS...: `strata sim ARGS` into $OUT/NAME in the background, one per core; its exit
# status in $OUT/NAME.rc.
launch() {
    local name=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
    { "$BIN" sim "$@" --seeds 5 --quiet --no-charts --out "$OUT/$name" >"$OUT/$name.txt" 2>&1
      echo $? >"$OUT/$name.rc"; } &
}
ran() { [ "$(cat "$OUT/$1.rc" 2>/dev/null)" = 0 ]; } # ran NAME: its sim exited 0
col() { awk -F, -v p="$3" -v c="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==c) k=i} NR>1 && $1==p{print $k}' "$1/summary.csv"; }

# check NAME | documented: strata P99 ms, blitzscale P99 ms, P99 change %, attainment change
# (points), GPU-seconds change %
check() {
    local name=$1 s99=$2 b99=$3 dp99=$4 dslo=$5 dgpu=$6
    if ! ran "$name"; then
        nok "sim_headline: $name" "$(tail -2 "$OUT/$name.txt")"
        return
    fi
    local sp sb sa ba sg bg
    sp=$(col "$OUT/$name" ttft_p99_ms strata) sb=$(col "$OUT/$name" ttft_p99_ms blitzscale)
    sa=$(col "$OUT/$name" slo_attainment strata) ba=$(col "$OUT/$name" slo_attainment blitzscale)
    sg=$(col "$OUT/$name" gpu_seconds strata) bg=$(col "$OUT/$name" gpu_seconds blitzscale)
    local got
    got=$(awk -v sp="$sp" -v sb="$sb" -v sa="$sa" -v ba="$ba" -v sg="$sg" -v bg="$bg" 'BEGIN{
        printf "P99 %.0f vs %.0f ms (%+.1f%%), SLO %+.1f points, GPU-s %+.1f%%",
            sp, sb, 100 * (sp / sb - 1), 100 * (sa - ba), 100 * (sg / bg - 1)}')
    if awk -v sp="$sp" -v sb="$sb" -v sa="$sa" -v ba="$ba" -v sg="$sg" -v bg="$bg" \
        -v s99="$s99" -v b99="$b99" -v dp="$dp99" -v ds="$dslo" -v dg="$dgpu" 'function abs(x){return x<0?-x:x}
        BEGIN{exit !(abs(sp / s99 - 1) <= 0.03 && abs(sb / b99 - 1) <= 0.03 &&
                     abs(100 * (sp / sb - 1) - dp) <= 3 && abs(100 * (sa - ba) - ds) <= 1 &&
                     abs(100 * (sg / bg - 1) - dg) <= 1)}'; then
        ok "sim_headline: $name: $got"
    else
        nok "sim_headline: $name" "$got; documented P99 $s99 vs $b99 ms ($dp99%), SLO $dslo points, GPU-s $dgpu%"
    fi
}
# The runs: Strata against BlitzScale on six workloads, the placement matrix against none, a
# holder's failure.
B='--policy blitzscale --policy strata'
# shellcheck disable=SC2086
{
launch conv --trace "$T/azure_llm_2023_conv.csv" --rate 10 --gpus H100:32 --model 13B $B
launch code --trace "$T/azure_llm_2023_code.csv" --rate 10 --gpus H100:32 --model 13B $B
launch synth --synthetic rps=30,dur=300,burst=120,at=20,len=10,ramp=5,every=60,in=1024,out=128 \
    --gpus H100:32 --model 13B $B
launch conv-256 --trace "$T/azure_llm_2023_conv.csv" --rate 12 --gpus H100:256 --model 70B $B
launch code-256 --trace "$T/azure_llm_2023_code.csv" --rate 12 --gpus H100:256 --model 70B $B
launch synth-256 --synthetic rps=60,dur=300,burst=240,at=20,len=10,ramp=5,every=60,in=1024,out=128 \
    --gpus H100:256 --model 70B $B
}
launch het --trace "$T/azure_llm_2023_conv.csv" --rate 10 --gpus A100:16,H100:16 --model 13B \
    --policy strata --policy strata-nomatrix
launch fail --config tests/fixtures/sim/three_nodes.conf --synthetic rps=2,dur=40,burst=40,at=10,len=10,in=512,out=32 \
    --policy strata --policy blitzscale
wait

check conv 855 1572 -45.6 5.0 -1.3
check code 2330 2404 -3.1 13.5 -3.3
check synth 2006 2705 -25.9 29.8 -0.3
check conv-256 867 1515 -42.8 70.6 -8.1
check code-256 4456 4221 5.6 8.0 -11.7
check synth-256 743 1153 -35.6 61.5 -3.3

# heterogeneity: the throughput matrix against placement that ignores it (-54% P99, +35 points,
# -16% GPU-seconds; docs: 836 vs 1835 ms, 93.9% vs 59.1%, 3872 vs 4627 GPU-s)
if ran het; then
    got=$(for p in strata strata-nomatrix; do
        echo "$(col "$OUT/het" ttft_p99_ms $p) $(col "$OUT/het" slo_attainment $p) $(col "$OUT/het" gpu_seconds $p)"
    done | tr '\n' ' ')
    if awk -v g="$got" 'function near(x, w, t) { return x / w - 1 <= t && 1 - x / w <= t }
        BEGIN { split(g, v, " "); exit !(near(v[1], 836, 0.03) && near(v[4], 1835, 0.03) &&
            v[2] - 0.939 <= 0.01 && 0.939 - v[2] <= 0.01 && v[5] - 0.591 <= 0.01 && 0.591 - v[5] <= 0.01 &&
            near(v[3], 3872, 0.01) && near(v[6], 4627, 0.01)) }'; then
        ok "sim_headline: heterogeneity (A100 x16 + H100 x16): matrix against none, P99 / attainment / GPU-s: $got"
    else
        nok "sim_headline: heterogeneity" "$got; documented 836 0.939 3872 1835 0.591 4627"
    fi
else
    nok "sim_headline: heterogeneity" "$(tail -2 "$OUT/het.txt")"
fi

# a holder dies mid scale-out (tests/integration/sim.sh's 3-node config): R = 2 serves 443 of 443
# requests (median of 5 seeds), BlitzScale's single copy 18
if ran fail; then
    got="$(col "$OUT/fail" done strata)/$(col "$OUT/fail" requests strata) $(col "$OUT/fail" done blitzscale)/$(col "$OUT/fail" requests blitzscale)"
    [ "$got" = "443/443 18/443" ] && ok "sim_headline: a holder dies mid scale-out: Strata (R = 2) and BlitzScale serve $got" ||
        nok "sim_headline: holder failure" "served $got, documented 443/443 18/443"
else
    nok "sim_headline: holder failure" "$(tail -2 "$OUT/fail.txt")"
fi
exit $fail
