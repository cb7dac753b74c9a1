#!/bin/bash
# sim_compare: the tables and charts of docs/simulator.md ("Results"): `strata sim` on both Azure
# traces and a synthetic bursty trace, 32 H100 with 13B and 256 H100 with 70B, every default
# policy plus Strata's ablations (strata-reactive, strata-standby), 5 seeds each (medians and
# their spread). About 6 minutes on 2 vCPUs. Usage: tests/bench/sim_compare.sh [OUT_DIR]
# (default /tmp/strata-sim-compare); SIM_COMPARE_ONLY=NAME runs one of the six.
set -u
cd "$(dirname "$0")/../.."
BIN=${STRATA:-build/strata}
OUT=${1:-/tmp/strata-sim-compare}
T=../shared/traces
# the synthetic trace: a base rate, bursts 4x above it every minute (5 s ramps, 10 s at the top)
SYN32="rps=30,dur=300,burst=120,at=20,len=10,ramp=5,every=60,in=1024,out=128"
SYN256="rps=60,dur=300,burst=240,at=20,len=10,ramp=5,every=60,in=1024,out=128"
POL="--policy fixed --policy stop-the-world --policy serverlessllm --policy lambdascale
     --policy blitzscale --policy tokenscale --policy strata --policy strata-reactive
     --policy strata-standby"
run() {
    local name=$1
    shift
    [ -n "${SIM_COMPARE_ONLY:-}" ] && [ "$SIM_COMPARE_ONLY" != "$name" ] && return 0
    echo "== $name: strata sim $*"
    # shellcheck disable=SC2086
    "$BIN" sim "$@" $POL --seeds 5 --quiet --out "$OUT/$name" | tee "$OUT/$name.txt"
}
mkdir -p "$OUT"
run conv-32-13B --trace $T/azure_llm_2023_conv.csv --rate 10 --gpus H100:32 --model 13B
run code-32-13B --trace $T/azure_llm_2023_code.csv --rate 10 --gpus H100:32 --model 13B
run synth-32-13B --synthetic "$SYN32" --gpus H100:32 --model 13B
run conv-256-70B --trace $T/azure_llm_2023_conv.csv --rate 12 --gpus H100:256 --model 70B
run code-256-70B --trace $T/azure_llm_2023_code.csv --rate 12 --gpus H100:256 --model 70B
run synth-256-70B --synthetic "$SYN256" --gpus H100:256 --model 70B
