#!/bin/bash
# cluster_chaos: a chaos soak of a Strata cluster (issue 26). 5 `strata serve --cluster` nodes in
# network namespaces on one bridge (nodes 1 and 2 start with the tiny model, R = 2), a steady
# open-loop load shaped by the Azure conversation trace, and a seeded schedule of faults every few
# seconds: SIGKILL of the leader, of a helper under requests, of a source mid-stream; a partition
# and heal; a slow link (tbf: this kernel has no netem); a full disk under a node's raft directory
# (a small tmpfs, filled); a clock jump (+/- 90 s through the test hook --test-clock-file:
# faketime is not available, and the host's clock is shared); a restart. Every completion must be
# the reference's exact greedy text or a clear error, never wrong text, never a hang past the
# client's 60 s; at the end no raft commit is lost, R = 2 host copies are back and every node is
# in raft's configuration. The driver is tests/soak/cluster_chaos.py; its report (a table) is in
# the work dir and printed as "# " lines.
#   tests/soak/cluster_chaos.sh [--duration S] [--seed N] [--rate R] [--min-faults F] [--nodes N]
#                               [--kinds kill_leader,partition,...]
# `make soak` runs 10 minutes (>= 20 faults, every kind); tests/integration/cluster_chaos.sh, in
# `make test`, about a minute (the quick kinds). Needs root (namespaces, tmpfs) and python3.
set -u
cd "$(dirname "$0")/../.."
. tests/lib/serve.sh
DURATION=600 SEED=1 RATE=1.5 MIN_FAULTS=20 NAME=cluster_chaos NODES=5 KINDS=
while [ $# -gt 0 ]; do
    case $1 in
    --duration) DURATION=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --min-faults) MIN_FAULTS=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --kinds) KINDS=$2; shift 2 ;;
    *) echo "usage: $0 [--duration S] [--seed N] [--rate R] [--min-faults F] [--nodes N]" \
        "[--kinds K,...]" >&2; exit 2 ;;
    esac
done
[ -x "$STRATA" ] || { echo "not ok - $NAME: $STRATA not built"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "skip - $NAME: needs root (network namespaces, tmpfs)"; exit 0; }
command -v python3 >/dev/null || { echo "skip - $NAME: needs python3"; exit 0; }
TRACE=${STRATA_SHARED:-../shared}/traces/azure_llm_2023_conv.csv
[ -f "$TRACE" ] || { echo "skip - $NAME: no $TRACE"; exit 0; }
serve_model || { echo "not ok - $NAME: cannot convert the tiny model"; exit 1; }
W=$(mktemp -d "/tmp/$NAME.XXXXXX")
HUB="schaos$$h"
cleanup() {
    ip netns del "$HUB" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/key"
ip netns add "$HUB" || { echo "not ok - $NAME: cannot make a network namespace"; exit 1; }
ip netns exec "$HUB" python3 tests/soak/cluster_chaos.py --duration "$DURATION" --seed "$SEED" \
    --rate "$RATE" --min-faults "$MIN_FAULTS" --nodes "$NODES" --kinds "$KINDS" --work "$W" --strata "$(realpath "$STRATA")" \
    --model "$(realpath "$SERVE_MODEL")" --trace "$TRACE" --hub "$HUB"
rc=$?
[ $rc = 0 ] || echo "# $NAME: logs in $W (kept with KEEP=1)"
exit $rc
