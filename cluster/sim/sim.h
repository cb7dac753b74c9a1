/* sim: `strata sim`'s discrete-event cluster simulator. One simulation = one policy on one
 * cluster and one request stream; the policy's controller (sim_policy.h: Strata's own planner,
 * cluster/planner.h, or a published system's rules) makes every scale and routing decision, the
 * scheduler's step-time model (serving/sched/step_model.h) times every GPU step, and SimGrid
 * (sim_net.h) is the clock and the network. Instance ids are shuffled by the seed (instance
 * numbers in a config refer to the listing order and are mapped), so no result depends on the
 * order GPUs are listed in.
 *
 * Model (docs/simulator.md): a GPU instance (one tensor-parallel group on one server) runs
 * iteration-level batching like serving/sched/scheduler.c: each step decodes one token of every
 * running sequence and prefills waiting prompts in FIFO order up to a token budget that keeps
 * the running sequences within their TPOT; its duration is step_model_predict() of the instance's
 * GPU type. Loads move the model layer by layer (one chunk per layer) over the policy's tiers.
 * A joining instance with k of L layers serves when the policy has live execution: layers
 * [k, L) run on its helper, whose next step is longer by that share of the work.
 *
 * sim_run() runs the simulation in a child process (SimGrid's engine is once per process), so
 * one `strata sim` runs several policies side by side. Deterministic for a seed. */
#ifndef STRATA_SIM_H
#define STRATA_SIM_H

#include "serving/sched/step_model.h"

#include <stddef.h>

#define SIM_MAX_TYPES 4

struct sim_gpu_type {
    char name[16];
    double tflops;   /* dense fp16 TFLOP/s */
    double mem_GBps; /* HBM GB/s */
    double mem_GB;   /* HBM capacity */
    double usd_hour; /* price per GPU-hour */
    /* step-time coefficients per model size if given (config file); else derived from specs */
};

struct sim_model_spec {
    char name[8];
    double params; /* parameters */
    int layers;
    double bytes;        /* weights (fp16) */
    double kv_bytes_tok; /* KV cache bytes per token */
};

struct sim_tiers {
    double nvlink_Bps; /* per GPU */
    double nic_Bps;    /* RDMA NIC per GPU */
    double pcie_Bps;   /* host memory -> GPU, per GPU */
    double ssd_Bps;    /* per server */
    double remote_Bps; /* remote storage, whole cluster */
    double latency_s;
};

enum sim_source { SIM_SRC_SSD, SIM_SRC_REMOTE, SIM_SRC_HOST, SIM_SRC_NET };
enum sim_multicast { SIM_MC_NONE, SIM_MC_CHAIN, SIM_MC_BINOMIAL };

struct sim_controller;

struct sim_policy {
    char name[24];
    const struct sim_controller *ctl; /* who decides (sim_policy.h) */
    int source;                       /* enum sim_source: where a joiner's layers come from */
    int multicast;                    /* enum sim_multicast (SIM_SRC_NET) */
    int live;                         /* a joiner serves with k < L layers (execute-while-load) */
    int cache_on_load;                /* a node that loaded the model keeps it in host memory */
    int cache_all;       /* every server holds the model in host memory from the start */
    int replicas_cached; /* R */
    int ignore_matrix;
    /* Strata's planner (plan_config): the forecast's scale-up, capacity scale-in with hand-over,
     * partial residency */
    int proactive, handover, standby;
};

struct sim_request {
    double t;    /* arrival, seconds */
    int in, out; /* prompt and generated tokens */
};

struct sim_failure {
    double t;
    int inst; /* instance to fail; -1: the source of a scale-out in progress then */
};

#define SIM_MAX_SCALEOUTS      8
#define SIM_MAX_SPANS          512
#define SIM_SCALEOUT_MAX_CHAIN 16

/* A scale-out fixed in advance (config `scaleout = T:SRC:DST[,DST...]`): at time T the instance
 * SRC (holding the model) starts a chain SRC -> DST1 -> DST2 ... over the policy's data plane,
 * whatever the planner says. For replaying a measured scenario. */
struct sim_scaleout_spec {
    double t;
    int src, n, chain[SIM_SCALEOUT_MAX_CHAIN];
};

struct sim_config {
    int n_types;
    struct sim_gpu_type types[SIM_MAX_TYPES];
    int type_gpus[SIM_MAX_TYPES]; /* GPUs of each type (servers are homogeneous) */
    int gpus_per_server;
    int servers_per_rack; /* servers of one rack (failure domain) in server order; 0: one rack */
    int gpus_per_inst;    /* 0: smallest power of two holding the model with KV room */
    struct sim_tiers tiers;
    struct sim_model_spec model;
    double fail_prob; /* per node, for R and the loss probability */

    const struct sim_request *req;
    int n_req;
    double horizon_s; /* stop admitting at this time; run until drained or horizon*2 */

    int initial_replicas;
    double keep_alive_s;
    double tick_s; /* planner period */
    int max_step_tokens;
    int max_seqs; /* per instance */
    int max_joiners;
    double ttft_floor_ms, ttft_per_tok_ms; /* SLO: max(floor, per_tok x input) */
    double tbt_slo_ms;                     /* 0: 5 x the unloaded decode step on the fastest type */
    int no_planner; /* `planner = off`: no ticks, no planner decisions (fixed scale-outs only) */
    int send_to;    /* >= 0: every request goes to this instance (held until it can serve); -1:
                       planner_route places them */
    int live_min_layers; /* a live joiner serves from this many layers on (0: at once) */
    int kv_recompute;    /* `kv_recompute = on`: when a live joiner's k rises, its next step also
                            recomputes the new layers' KV of its running sequences (what the live
                            joiner does); off (default): free, as the published designs' figures */
    /* `model_spans`: the model's transfer units (layers, embedding, head) with their sizes, in
     * the order they are sent; 0: model.layers units of model.bytes / model.layers each */
    int n_spans;
    double span_bytes[SIM_MAX_SPANS];
    double chunk_bytes; /* > 0: transfers move (and forward) pieces of at most this many bytes of
                           a layer, the layer usable when its last piece lands; 0: whole layers */
    struct sim_scaleout_spec scaleouts[SIM_MAX_SCALEOUTS];
    int n_scaleouts;
    int step_set[SIM_MAX_TYPES]; /* 1: step[t] given (fitted), not derived */
    struct step_model step[SIM_MAX_TYPES];
    /* `admit_step = TYPE:a,b,c`: the step model the instance's scheduler admits prompt chunks
     * with (its TPOT guard), where it differs from the time steps take (a live joiner skips
     * calibration and admits with the default model); unset: step[t] */
    int admit_set[SIM_MAX_TYPES];
    struct step_model admit_step[SIM_MAX_TYPES];
    /* `plan_step = TYPE:a,b,c`: the step model the planner predicts TTFT with (what a live node
     * reports), where it is not the time steps take (a live node whose steps are padded by
     * --test-step-delay-us fits and reports the model without the pad); unset: step[t] */
    int plan_set[SIM_MAX_TYPES];
    struct step_model plan_step[SIM_MAX_TYPES];
    int replicas_cached; /* `replicas_cached = R`: the policy's R overridden (0: the policy's) */
    struct sim_failure failures[16];
    int n_failures;
    int progress; /* progress lines on stderr */
    unsigned seed;
    int no_shuffle; /* 1: instance ids in listing order (checks of the shuffle itself) */
    /* Strata's planner knobs (`fc_period_ms`, `fc_alpha`, `fc_beta`, `fc_z`, `util_high`,
     * `util_low`, `standby_max`; docs/simulator.md) */
    double fc_period_ms, fc_alpha, fc_beta, fc_z, fc_z_in, util_high, util_low;
    double fc_fast_ms, onset_ratio, fc_queue; /* the onset detector (plan_config) */
    int standby_max;
    /* ServerlessLLM's released defaults (`sllm_target` ongoing requests per instance,
     * `sllm_max_queue` requests an instance takes, `sllm_keep_alive_s`; sim_serverlessllm.h) */
    double sllm_target, sllm_keep_alive_s;
    int sllm_max_queue;
};

#define SIM_CDF_POINTS 200

struct sim_result {
    char policy[24];
    int n_req, n_done, n_attained;
    int ttft_missed, tpot_missed; /* requests past their TTFT SLO; done within it but past TPOT */
    double ttft_p50, ttft_p90, ttft_p99, ttft_mean; /* ms */
    double tbt_p50, tbt_p90, tbt_p99;               /* ms, every gap between two tokens */
    double tpot_p50, tpot_p99; /* ms, per request: its mean gap (what the TBT SLO is checked on) */
    double attainment;         /* fraction of requests within both SLOs */
    double goodput_rps;        /* requests within SLO per second */
    double gpu_s, cost_usd;
    double standby_gpu_s;   /* of gpu_s: standbys, charged at the share of HBM their layers hold */
    double proactive_gpu_s; /* of gpu_s: allocations a forecast started */
    double fp_gpu_s;        /* of those: allocations that served no request (false positives) */
    int handovers, moved_seqs, restarts; /* scale-ins with a hand-over, sequences moved; requests
                                            that lost progress to a scale-in (0 with hand-over) */
    int cold_starts, scaleouts, failures_injected, scaleouts_broken;
    double so_mean_s, so_max_s;
    double first_token_s; /* the earliest first token of any request (simulated time), -1: none */
    double first_scaleout_s; /* the first scale-out's decision (simulated time), -1: none */
    int max_replicas;
    double sim_end_s, wall_s;
    long events;
    double ttft_cdf[SIM_CDF_POINTS]; /* ms at quantile (i+1)/POINTS */
};

/* The published systems' designs and Strata's own (see docs/simulator.md); sim_policy_names: the
 * default set, in table order; more by name (sim_policy_by_name). */
int sim_policy_by_name(const char *name, struct sim_policy *p);
extern const char *const sim_policy_names[];
extern const char *const sim_policy_extra_names[];

void sim_config_default(struct sim_config *c);
int sim_model_by_name(const char *name, struct sim_model_spec *m);
int sim_gpu_by_name(const char *name, struct sim_gpu_type *g);
/* Step model of an instance of g GPUs of type t for model m, from specs (docs/simulator.md). */
void sim_step_model(const struct sim_gpu_type *t, int g, const struct sim_model_spec *m,
                    struct step_model *out);

/* Runs one policy in a child process. timeline_csv (may be NULL): per-second attainment and
 * replica counts written there. Returns 0, or -1 with err. */
int sim_run(const struct sim_config *c, const struct sim_policy *p, struct sim_result *r,
            const char *timeline_csv, char *err);
/* The same in this process (SimGrid once per process: tests fork around it). */
int sim_run_here(const struct sim_config *c, const struct sim_policy *p, struct sim_result *r,
                 const char *timeline_csv, char *err);

/* Checks and docs: the time (s) for the simulator's own multicast code (mc = SIM_MC_CHAIN or
 * SIM_MC_BINOMIAL) to bring the whole model from instance 0 to instances 1..n of cluster c, all
 * starting at once. In this process (fork around it). */
int sim_multicast_here(const struct sim_config *c, int mc, int n, double *seconds, char *err);

/* key = value settings shared by --config files and command-line flags (docs/simulator.md lists
 * them). Returns 0, or -1 with err naming the key and the reason. */
int sim_config_set(struct sim_config *c, const char *key, const char *value, char *err);
/* Every key sim_config_set knows, NULL-terminated (the command line offers each as --KEY). */
extern const char *const sim_config_keys[];
/* A config file: one "key = value" per line, '#' comments. */
int sim_config_parse(struct sim_config *c, const char *text, char *err);
int sim_config_load(struct sim_config *c, const char *path, char *err);

/* Requests: the Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), rows in time order.
 * The window [start_s, start_s + dur_s x rate) of the trace, compressed by rate (rate 2 replays
 * twice the traffic: twice the trace time in the same simulated time). dur_s <= 0: to the end. */
int sim_trace_parse(const char *text, size_t len, double rate, double start_s, double dur_s,
                    struct sim_request **out, int *n, char *err);
int sim_trace_load(const char *path, double rate, double start_s, double dur_s,
                   struct sim_request **out, int *n, char *err);
/* Exact arrivals: a CSV with the header "seconds,in,out" and one request per line (arrival time
 * in seconds from 0, in time order; prompt and generated tokens >= 1); '#' starts a comment. */
int sim_requests_parse(const char *text, size_t len, struct sim_request **out, int *n, char *err);
int sim_requests_load(const char *path, struct sim_request **out, int *n, char *err);
/* Synthetic Poisson arrivals: "rps=R,dur=S[,burst=R2,at=T,len=D[,ramp=U][,every=P]][,in=N]
 * [,out=M]": R requests/s for S seconds, R2 more from T for D seconds (ramping up and down over U
 * seconds each side), again every P seconds; prompts of N tokens, M generated. */
int sim_synthetic(const char *spec, unsigned seed, struct sim_request **out, int *n, char *err);

#endif
