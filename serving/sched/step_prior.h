/* step_prior: the step model a node starts serving with, before it has timed a single step of its
 * own (the scheduler then corrects it from every step: step_model.h), best first:
 *
 *   1. the cache: what this node fitted last time for the same model on the same hardware
 *      (step_cache.h), in its state directory;
 *   2. a cluster member's: the model a member with the same identity (the same model header on
 *      the same hardware, step_identity_hash) fitted, from its load reports (cluster/control.h
 *      control_member_step); as good as a cache when it covers every calibration shape;
 *   3. a default scaled from the model's size and the memory bandwidth measured now (tens of
 *      milliseconds on the weights themselves): a decode step of one token costs one pass over
 *      the weights, half of it fixed (c), half per token (a: a prefill token costs as much as a
 *      decode row, so long chunks are predicted slower than they run, not faster). Only its
 *      shape lasts: the first step timed scales it (step_model.h).
 *
 * The state directory: --state-dir DIR; as the appliance's PID 1, the model's partition when the
 * model lives on one (mounted read-only by init: remounted read-write for the moment of a write);
 * otherwise $XDG_CACHE_HOME/strata or ~/.cache/strata. --state-dir off keeps nothing. */
#ifndef STRATA_STEP_PRIOR_H
#define STRATA_STEP_PRIOR_H

#include "serving/engine/loader.h"
#include "serving/sched/step_cache.h"

#include <stddef.h>

enum step_source { STEP_FROM_CACHE, STEP_FROM_MEMBER, STEP_FROM_DEFAULT };

/* A cluster member's fitted model for the same identity (control_member_step). */
struct step_member {
    struct step_model m;
    double err;
    int calibrated; /* it covers every calibration shape: no idle calibration needed here */
    unsigned long long node;
};

struct step_prior {
    int source; /* enum step_source */
    struct step_model m;
    double err;              /* its uncertainty (the cache's own estimate; 100% for the default) */
    long steps;              /* the cache: steps it was fitted from */
    unsigned long long node; /* the member's: its node id */
    int calibrated;          /* the cache, or a member's that covers every shape */
    double bw;               /* the default: bytes/s measured (0: not measured, a fixed guess) */
    char path[4096];         /* the cache file (read or to be written) */
};

/* Where the node's state lives: 0 and dir (remount: 1 when it is a read-only partition to remount
 * for a write); 1 when there is none (off, or nowhere that survives a restart). */
int step_state_dir(const char *opt, const char *model_path, int pid1, char *dir, size_t cap,
                   int *remount);
/* The identity of lm's model on this engine (model header digest; backend, device, ISA, threads,
 * KV type, weight layout). */
void step_identity_of(const struct loaded_model *lm, struct step_identity *id);
/* The best prior for lm (dir: NULL, none; member: NULL, none). A cache that is there but
 * unusable is logged in one line (warn) and passed over. weights_here: lm's weight image is
 * complete (else the bandwidth is not measured on it: a fixed guess). */
void step_prior_choose(const struct loaded_model *lm, const struct step_identity *id,
                       const char *dir, const struct step_member *member, int weights_here,
                       struct step_prior *p);
/* The default for a model of `bytes` weights read at `bw` bytes/s. */
void step_prior_default(struct step_model *m, double bytes, double bw);
/* Write the fitted model to dir (remounting it read-write meanwhile when remount). */
int step_prior_save(const char *dir, int remount, const struct step_identity *id,
                    const struct step_cached *c, char *err);

#endif
