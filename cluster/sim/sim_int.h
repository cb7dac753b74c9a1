/* sim_int: the simulator's internals, shared by its three parts and by nothing outside
 * cluster/sim/:
 *   sim.c        setup (a list of named steps), the driver (the event loop), the results;
 *   sim_serve.c  the instances: queues, iteration-level steps, routing, hand-overs;
 *   sim_load.c   scale-outs (chains, binomial pipelines, tier loads), the controller's actions,
 *                standbys, releases, failures.
 * One simulation per process (SimGrid's engine is once per process): sim_g is that simulation,
 * for the transfer callbacks. */
#ifndef STRATA_SIM_INT_H
#define STRATA_SIM_INT_H

#include "cluster/planner.h"
#include "cluster/sim/sim.h"
#include "cluster/sim/sim_policy.h"
#include "os/common/errmsg.h"

#define TBT_BUCKETS 1200 /* log buckets of 1% from 0.1 ms */

enum { EV_STEP, EV_TICK, EV_FAIL, EV_SAMPLE, EV_KILL, EV_SCALEOUT };

struct event {
    double t;
    long seq; /* FIFO among equal times: determinism */
    int type, a, b;
};

struct sreq {
    double t_arr, t_first, t_last, t_done, tbt_sum, slo_ttft_ms;
    int in, out, gen, prefill_left, step_prefill, step_decode, inst;
};

struct inst {
    int server, type, gpus, epoch, busy, so, member;
    int tokens_epoch; /* epoch + 1 once this allocation generated a token (the trace's line) */
    struct step_model sm, sm_admit;         /* step time; the model its scheduler admits with */
    int *wait, wait_head, wait_n, wait_cap; /* FIFO ring of request indices */
    int *run, n_run;
    long kv_used, kv_cap, wait_tokens;
    double borrowed, alloc_since, load_start;
    double standby_since; /* >= 0: a standby since then (charged at its layers' share of HBM) */
    double prefill_tok_s; /* back-to-back full prompt chunks, nothing running */
    int served;           /* requests placed here since this allocation */
    int proactive;        /* this allocation was a forecast's scale-up */
    int leaving;          /* handing its requests over: takes none, keeps its GPU until they land */
    int leave_pending;    /* leave at the end of the step in flight */
    int leave_to, leave_keep; /* that hand-over's receiver (-1: none) and standby layers */
};

struct xfer_ctx {
    int so, member, chunk;
};

struct scaleout {
    int active, kind, src_host, src_inst, n, C, mc, d, round, pending, broken;
    int first;       /* chunks [0, first) are there already (a standby's layers) */
    int idle_rounds; /* binomial: rounds in a row in which nothing could move */
    int members[PLAN_MAX_CHAIN], got[PLAN_MAX_CHAIN], hop_sent[PLAN_MAX_CHAIN],
        hop_busy[PLAN_MAX_CHAIN], done[PLAN_MAX_CHAIN];
    unsigned char *have; /* binomial: [n * C] chunk present */
    int snd_from[PLAN_MAX_CHAIN + 1], snd_to[PLAN_MAX_CHAIN + 1], snd_chunk[PLAN_MAX_CHAIN + 1];
    double started;
};

struct sim {
    const struct sim_config *c;
    const struct sim_policy *p;
    struct sim_result *r;
    void *ctl_state;
    struct plan_model pm;
    struct plan_node *pn;
    struct sim_inst_info *info; /* what controllers see of each instance (sim_obs) */
    struct inst *in;
    int *id_of; /* [listing index] -> instance id (the seed's shuffle) */
    int n_inst, n_servers, L;
    double tput[SIM_MAX_TYPES];
    struct step_model step[SIM_MAX_TYPES];
    struct step_model plan_step[SIM_MAX_TYPES]; /* what the planner predicts with */
    int R;                                      /* host copies to keep */
    struct sreq *q;
    int next_arrival, n_done;
    int *held, held_head, held_n, held_cap;
    int arrived;
    long arrived_tokens;
    struct event *heap;
    int heap_n, heap_cap;
    long seq;
    struct scaleout *so;
    int n_so, so_cap;
    double now, tbt_slo_ms, tick_s;
    /* chunk_bytes set: the transfer chunks, n_chunks of them; layers_after[k]: layers complete
     * once chunks [0, k] are held. Else one chunk per layer. */
    int n_chunks;
    double *piece_bytes;
    int *layers_after;
    long tbt_hist[TBT_BUCKETS];
    double so_sum;
    int so_count;
    int *sec_serving, *sec_joining, n_sec;
    int holder_fail_pending; /* a "holder" failure waits for the next network scale-out */
    int trace_actions;       /* STRATA_SIM_TRACE set: every action on stderr */
    char err[ERRMSG_LEN];
    int failed;
};

extern struct sim *sim_g;

/* sim.c */
void sim_push(struct sim *s, double t, int type, int a, int b);
void *sim_grow(void *p, int *cap, int need, size_t elem);
struct plan_view sim_view(struct sim *s, struct plan_scaleout *pso, int *n_pso);
struct sim_obs sim_obs_of(struct sim *s, const struct plan_view *v);

/* sim_serve.c */
int sim_serving(const struct sim *s, int i);
int sim_usable(const struct sim *s, int i);
void sim_update_load(struct sim *s, int i);
void sim_kick(struct sim *s, int i);
void sim_enqueue(struct sim *s, int i, int r, int front);
int sim_route(struct sim *s, int r);
void sim_reroute_held(struct sim *s);
void sim_step_done(struct sim *s, int i);
void sim_tbt_add(struct sim *s, double gap_s);
/* Takes every request off instance i: queued ones are routed again, running ones go to
 * instance `to` with their KV (a transfer; -1: routed again and recomputed, which counts as a
 * restart when `scale_in` and they had progress). */
void sim_evacuate(struct sim *s, int i, int to, int scale_in);

/* sim_load.c */
double sim_layer_bytes(const struct sim *s, int k);
void sim_gpu_release(struct sim *s, int i);
int sim_do_actions(struct sim *s);
void sim_fixed_scaleout(struct sim *s, const struct sim_scaleout_spec *f);
void sim_fail_inst(struct sim *s, int i);
/* Instance i leaves (a scale-down): its running sequences go to `to` (-1: none, re-placed and
 * recomputed), it keeps layers [0, keep) as a standby (0: none); at once when idle, else at the
 * end of its step in flight, its GPU held until the hand-over lands (sim_leave_done). */
void sim_leave(struct sim *s, int i, int to, int keep);
void sim_leave_done(struct sim *s, int i);
void sim_fix_helpers(struct sim *s);
int sim_new_so(struct sim *s, int kind, int src_host, int src_inst, const int *members, int n,
               int mc, int first);

#endif
