/* serve_cluster: what `strata serve` needs to join its cluster, in one call.
 *
 * serve_cluster_start() starts the control thread (cluster/control.h) with the serving process's
 * load (serve_metrics and the scheduler's step model, read on the control thread), registers
 * GET /v1/cluster and the cluster's /metrics lines with the front, and installs the executor.
 * Until the live scale-out (issue 13: weights over the fabric, split execution) provides the
 * real executor, a node started with --cluster-standby already holds the model and the stand-in
 * executor only moves what it reports: a scale-up raises k by a quarter of L per heartbeat to L,
 * a scale-down leaves the engine, a host-copy drop or replication flips the host flag. It is the
 * fake the control plane's tests run against; it moves no byte of weights. */
#ifndef STRATA_SERVE_CLUSTER_H
#define STRATA_SERVE_CLUSTER_H

#include "cluster/control.h"
#include "serving/api/metrics.h"
#include "serving/sched/scheduler.h"
#include "serving/api/serve_front.h"

struct serve_cluster;

struct serve_cluster *serve_cluster_start(const struct control_cfg *cfg, struct front *f,
                                          struct serve_metrics *m, struct scheduler *s,
                                          int max_step_tokens, char *err);
void serve_cluster_stop(struct serve_cluster *sc);

#endif
