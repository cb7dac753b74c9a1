#!/bin/bash
# sim_headline: the headline figures of docs/simulator.md and the README, asserted, not only
# printed: Strata against faithful BlitzScale on 32 H100 with 13B, the two Azure traces at 10x and
# the synthetic bursty trace, medians over 5 seeds (tests/bench/sim_compare.sh's first three
# tables). The simulator is deterministic, so the figures are exact on any machine; the tolerances
# (3 points of P99 change, 1 point of attainment, 1 point of GPU-seconds, 3% of each P99) let a
# small model change through and catch a policy's behaviour changing. About 30 s here.
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
col() { awk -F, -v p="$3" -v c="$2" 'NR==1{for(i=1;i<=NF;i++) if($i==c) k=i} NR>1 && $1==p{print $k}' "$1/summary.csv"; }

# name | strata sim arguments | documented: strata P99 ms, blitzscale P99 ms, P99 change %,
# attainment change (points), GPU-seconds change %
check() {
    local name=$1 args=$2 s99=$3 b99=$4 dp99=$5 dslo=$6 dgpu=$7
    # shellcheck disable=SC2086
    if ! "$BIN" sim $args --policy blitzscale --policy strata --seeds 5 --quiet --out "$OUT/$name" \
        >"$OUT/$name.txt" 2>&1; then
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
check conv "--trace $T/azure_llm_2023_conv.csv --rate 10 --gpus H100:32 --model 13B" \
    740 1572 -52.9 6.0 -2.4
check code "--trace $T/azure_llm_2023_code.csv --rate 10 --gpus H100:32 --model 13B" \
    2406 2404 0.1 5.0 -2.6
check synth "--synthetic rps=30,dur=300,burst=120,at=20,len=10,ramp=5,every=60,in=1024,out=128 \
--gpus H100:32 --model 13B" 641 2705 -76.3 59.4 1.7
exit $fail
