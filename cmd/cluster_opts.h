/* cluster_opts: the options of the cluster's control plane (cluster/control.h) for `strata serve`,
 * in cmd/options.h's format, appended to serve's table like the fabric's:
 *
 *   --cluster ID@HOST:PORT,...  --cluster-addr HOST:PORT  --raft-dir DIR
 *   --cluster-heartbeat-ms MS  --cluster-dead-ms MS  --keep-alive-ms MS  --replicas-cached R
 *   --cluster-remove-ms MS (default CONTROL_REMOVE_MS, 0: never)  --cluster-handshake-ms MS
 *   --scaleout-timeout-ms MS  --gpu-type NAME  --rack NAME
 *   --cluster-recover ID,... (force this raft configuration on the log in --raft-dir, once:
 *   cluster/recover_req.h)
 *   --cluster-planner reactive|proactive (default reactive; proactive: the leading signal and
 *   capacity scale-in with hand-over, the simulator's policy "strata")
 * and, in a test build only, --cluster-standby, --test-refuse and --test-scale-in
 * (cmd/test_hooks.h).
 *
 * The node id and the cluster key are the fabric's (--node-id, --key-file: cmd/fabric_opts.h). */
#ifndef STRATA_CLUSTER_OPTS_H
#define STRATA_CLUSTER_OPTS_H

#include "cluster/control.h"
#include "cmd/options.h"

#define CLUSTER_N_OPTS 15

/* Writes CLUSTER_N_OPTS entries pointing into c at t, and the test hooks' after them
 * (TEST_HOOKS_CLUSTER_N_OPTS); returns how many. */
int cluster_options(struct control_cfg *c, struct opt *t);

#endif
