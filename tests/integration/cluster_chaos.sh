#!/bin/bash
# cluster_chaos (short): the chaos soak of tests/soak/cluster_chaos.sh for 2 minutes, at least 5
# faults, in `make test`; `make soak` runs it for 10 minutes and 20 faults. About 2.5 minutes.
cd "$(dirname "$0")/../.."
exec bash tests/soak/cluster_chaos.sh --duration 120 --min-faults 5 --seed "${CHAOS_SEED:-1}" --name cluster_chaos_short
