#!/bin/bash
# cluster_chaos (short): the chaos soak of tests/soak/cluster_chaos.sh in `make test`: 3 nodes,
# 30 s of load with the quick faults (SIGKILL of the leader, a partition, a clock jump, a restart),
# at least 2 of them; the same checks (every completion exact or a clean error, no commit lost,
# R restored, every node in the configuration). About a minute. `make soak` runs the whole soak:
# 5 nodes, 10 minutes, every kind of fault, at least 20.
cd "$(dirname "$0")/../.."
exec bash tests/soak/cluster_chaos.sh --duration 30 --min-faults 2 --nodes 3 \
    --kinds kill_leader,partition,clock_jump,restart --seed "${CHAOS_SEED:-1}" \
    --name cluster_chaos_short
