/* serve_cluster: what `strata serve` needs to be a member of its cluster.
 *
 * serve_cluster_start() starts the control thread (cluster/control.h) with the serving process's
 * load (serve_metrics and the scheduler's step model, read on the control thread), registers
 * GET /v1/cluster and the cluster's /metrics lines with the front, and installs the executor that
 * carries out the leader's committed decisions on this node:
 *
 *   scale_up   a node without the model (an empty member, `strata serve --cluster ... --fabric F
 *              --listen A` and no -m) hands the join to the serving process's main thread
 *              (serve_cluster_wait_job): it pulls the weights from the source, or from the joiner
 *              before it in the chain, straight into its arena, and serves while they arrive with
 *              the source as its cooperative helper (the live scale-out, docs/cluster.md). A node
 *              that already holds the whole model in host memory (scaled down before) serves it
 *              again at once: on the CPU engine the arena is both the host copy and the engine's.
 *              A node holding another model out of its engine switches: that model goes first
 *              (SC_JOB_JOIN with drop_first), unless this node holds its last host copy.
 *   scale_down the node leaves the engine: it reports engine 0 and the routing sends it nothing;
 *              the weights stay as its host copy. A scale-down naming a receiver hands the
 *              node's running sequences to that replica (cluster/coop.h "Hand-over"); without
 *              one, what runs finishes here.
 *   replicate  as scale_up, but the node reports only the host copy it gains (engine 0).
 *   drop_host  a node with the model out of its engine frees it (serve_cluster_wait_job returns
 *              SC_JOB_DROP: the main thread tears the engine down and waits empty again).
 * Progress comes back through serve_cluster_resident (k as layers verify), so the leader sees
 * the joiner's k, ends the scale-out at k = L, and /v1/cluster shows it.
 *
 * A node started with --cluster-standby keeps the stand-in executor the control plane's own tests
 * run against: it holds the model but reports it out of its engine, and a scale-up only raises
 * the k it reports, by a quarter of L per heartbeat; it moves no weights. */
#ifndef STRATA_SERVE_CLUSTER_H
#define STRATA_SERVE_CLUSTER_H

#include "cluster/control.h"
#include "serving/api/metrics.h"
#include "serving/sched/scheduler.h"
#include "serving/api/serve_front.h"

#include <stdatomic.h>

struct serve_cluster;

#define SC_MAX_OTHERS 4

enum sc_job_kind { SC_JOB_JOIN = 1, SC_JOB_DROP = 2 };

struct sc_job {
    int kind;                   /* enum sc_job_kind */
    char model[CL_STR_LEN + 1]; /* the model's name */
    uint64_t source;            /* node holding the whole model: the helper */
    char source_fabric[CL_STR_LEN + 1];
    char upstream_fabric[CL_STR_LEN + 1]; /* the joiner before us in the chain, "" if none */
    char other_fabric[SC_MAX_OTHERS][CL_STR_LEN + 1]; /* other holders: resume from these */
    int other_serves[SC_MAX_OTHERS]; /* 1: it serves the whole model in its engine (at the join):
                                        a helper if ours dies */
    int n_other;
    int engine;                      /* 1: serve it (scale-up); 0: host copy only (replicate) */
    char drop_first[CL_STR_LEN + 1]; /* a switch: this model's engine goes first, "" none */
    int drop_layers;                 /* its L */
};

/* sched may be NULL (an empty member: no engine yet). */
struct serve_cluster *serve_cluster_start(const struct control_cfg *cfg, struct front *f,
                                          struct serve_metrics *m, struct scheduler *s,
                                          int max_step_tokens, char *err);
void serve_cluster_stop(struct serve_cluster *sc);

/* Main thread: block until the executor hands this node a join (an empty node) or a drop (a node
 * whose host copy goes). 0 with *job, or -1 when *stop turned non-zero. */
int serve_cluster_wait_job(struct serve_cluster *sc, struct sc_job *job, atomic_int *stop);
/* The engine of a join exists (partial): load reports read this scheduler from now on. */
void serve_cluster_attach(struct serve_cluster *sc, struct scheduler *s, const char *model,
                          int n_layers, double bytes, int max_step_tokens);
/* Any thread: k of L layers resident (k = L: the whole model is here). */
void serve_cluster_resident(struct serve_cluster *sc, int k);
/* The join failed (the stream gave up): the node is empty again and says so. */
void serve_cluster_join_failed(struct serve_cluster *sc, const char *why);
/* Main thread, once a join's engine exists: fn (ctx) is called on the control thread when a live
 * node holding the joining model whole appears (it restarted with the file, or an operator
 * started one with -m): fabric is its fabric address, serves 1 when its engine runs the whole
 * model (a helper). The serving process pulls from it and takes it as a helper at once.
 * serve_cluster_detach clears it. */
void serve_cluster_on_holder(struct serve_cluster *sc,
                             void (*fn)(void *ctx, const char *fabric, int serves), void *ctx);
/* The engine's cooperative execution (NULL: none): a scale-down naming a receiver hands this
 * node's running sequences to it (coop_handover), a scale-up brings them back. */
struct coop;
void serve_cluster_set_coop(struct serve_cluster *sc, struct coop *coop);
/* The identity of the step model the scheduler runs (step_identity_hash): the load reports carry
 * it, and a member starting the same model on the same hardware takes this node's model as its
 * prior (serve_cluster_member_step). */
void serve_cluster_set_step_id(struct serve_cluster *sc, uint64_t id);
/* control_member_step through this node's control plane (0 when there is none). */
int serve_cluster_member_step(struct serve_cluster *sc, uint64_t id, struct step_model *m,
                              double *err, int *calibrated, uint64_t *node);
/* Main thread, before tearing an engine down: load reports stop reading the scheduler. */
void serve_cluster_detach(struct serve_cluster *sc);
/* Main thread, after: the host copy is gone, the node is an empty member again. */
void serve_cluster_dropped(struct serve_cluster *sc);
/* Main thread, a switch: the old model (job->drop_first) is gone; the join goes on. */
void serve_cluster_switched(struct serve_cluster *sc, const struct sc_job *job);

#endif
