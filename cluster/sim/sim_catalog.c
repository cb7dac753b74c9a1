/* The simulator's catalog: GPU types, model sizes, policies, and the step-time model derived
 * from a GPU's specs. Figures are public spec-sheet numbers; efficiencies are stated in
 * docs/simulator.md and can be overridden per run (--config). */
#include "cluster/sim/sim.h"

#include "cluster/sim/sim_policy.h"

#include <string.h>

static const struct sim_gpu_type gpus[] = {
    {"H100", 989, 3350, 80, 4.0},
    {"A100", 312, 2039, 80, 2.0},
    {"L40S", 362, 864, 48, 1.2},
    /* a CPU node (2 Zen 4 vCPUs: AVX-512 FMA at ~3.5 GHz, the ~28 GB/s streaming read measured
     * by tests/bench/membw.c); meant to be given a fitted step model (`step = CPU:a,b,c`) */
    {"CPU", 0.2, 28, 16, 0},
};

static const struct sim_model_spec models[] = {
    /* kv bytes per token: 2 (K, V) x layers x kv heads x head dim x 2 bytes */
    {"7B", 6.7e9, 32, 13.5e9, 2.0 * 32 * 32 * 128 * 2},
    {"13B", 13e9, 40, 26e9, 2.0 * 40 * 40 * 128 * 2},
    {"70B", 69e9, 80, 138e9, 2.0 * 80 * 8 * 128 * 2},
};

/* The default set, in table order: the fixed deployment, the published systems, Strata. */
const char *const sim_policy_names[] = {
    "fixed",      "stop-the-world", "serverlessllm", "lambdascale",
    "blitzscale", "tokenscale",     "strata",        NULL};
/* By name only: ServerlessLLM with every server's host memory holding the model (BlitzScale's
 * "all cache" optimum); Strata with partial residency (standbys); Strata's planner without its
 * leading signal and scale-in mechanisms (the ablation); Strata ignoring the throughput matrix; strata-stop-the-world, the live cluster's
 * `strata serve --stop-the-world` (the chain, the joiner serving only at k = L), for replaying its
 * measurements (tests/bench/sim_validate.sh). */
const char *const sim_policy_extra_names[] = {"serverlessllm-allcache", "strata-standby",
                                              "strata-reactive",        "strata-nomatrix",
                                              "strata-stop-the-world",  NULL};

/* A policy is a controller (who decides, sim_policy.h) on a data plane (where a joiner's layers
 * come from, whether it serves before it has them all). The published systems are each compared
 * on their own data plane; stop-the-world and λScale run BlitzScale's controller (λScale's own
 * scaling rule was not available, see docs/simulator.md), so their rows isolate the data plane,
 * and TokenScale runs on BlitzScale's, isolating the signal. */
int sim_policy_by_name(const char *name, struct sim_policy *p)
{
    memset(p, 0, sizeof *p);
    strncpy(p->name, name, sizeof p->name - 1);
    p->replicas_cached = 1;
    p->ignore_matrix = 1; /* the published systems are not heterogeneity-aware */
    if (!strcmp(name, "fixed")) {
        p->ctl = &sim_ctl_fixed;
        p->source = SIM_SRC_NET;
        p->multicast = SIM_MC_CHAIN;
    } else if (!strcmp(name, "stop-the-world")) {
        p->ctl = &sim_ctl_blitzscale;
        p->source = SIM_SRC_SSD;
    } else if (!strcmp(name, "serverlessllm") || !strcmp(name, "serverlessllm-allcache")) {
        /* host memory where cached, else the server's SSD; a server keeps what it loaded;
         * -allcache: every server holds the model in host memory from the start */
        p->ctl = &sim_ctl_serverlessllm;
        p->source = SIM_SRC_HOST;
        p->cache_on_load = 1;
        p->cache_all = !strcmp(name, "serverlessllm-allcache");
    } else if (!strcmp(name, "lambdascale")) {
        p->ctl = &sim_ctl_blitzscale;
        p->source = SIM_SRC_NET;
        p->multicast = SIM_MC_BINOMIAL;
        p->live = 1;
    } else if (!strcmp(name, "blitzscale") || !strcmp(name, "tokenscale")) {
        p->ctl = !strcmp(name, "blitzscale") ? &sim_ctl_blitzscale : &sim_ctl_tokenscale;
        p->source = SIM_SRC_NET;
        p->multicast = SIM_MC_CHAIN;
        p->live = 1;
    } else if (!strcmp(name, "strata-stop-the-world")) {
        p->ctl = &sim_ctl_strata;
        p->source = SIM_SRC_NET;
        p->multicast = SIM_MC_CHAIN;
        p->replicas_cached = 2;
        p->ignore_matrix = 0;
    } else if (!strcmp(name, "strata") || !strcmp(name, "strata-nomatrix") ||
               !strcmp(name, "strata-reactive") || !strcmp(name, "strata-standby")) {
        p->ctl = &sim_ctl_strata;
        p->source = SIM_SRC_NET;
        p->multicast = SIM_MC_CHAIN;
        p->live = 1;
        p->replicas_cached = 2; /* DESIGN.md: R = 2 recommended */
        p->ignore_matrix = !strcmp(name, "strata-nomatrix");
        /* the leading signal and zero-loss scale-in; partial residency only by name: it did
         * not pay for its HBM at 400 Gb/s (docs/simulator.md) */
        p->proactive = p->handover = strcmp(name, "strata-reactive") != 0;
        p->standby = !strcmp(name, "strata-standby");
    } else {
        return -1;
    }
    return 0;
}

int sim_model_by_name(const char *name, struct sim_model_spec *m)
{
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (!strcmp(models[i].name, name)) {
            *m = models[i];
            return 0;
        }
    return -1;
}

int sim_gpu_by_name(const char *name, struct sim_gpu_type *g)
{
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++)
        if (!strcmp(gpus[i].name, name)) {
            *g = gpus[i];
            return 0;
        }
    return -1;
}

/* Prefill is compute-bound (2 x params FLOPs per token at 50% of peak), decode memory-bound
 * (every step reads the weights once: c; every sequence reads its KV, taken at a 1024-token
 * context: b; at 80% of HBM bandwidth), plus 2 ms of fixed per-step cost (launches, sampling)
 * and 0.5 ms of tensor-parallel all-reduce when the instance spans GPUs. */
void sim_step_model(const struct sim_gpu_type *t, int g, const struct sim_model_spec *m,
                    struct step_model *out)
{
    double flops = g * t->tflops * 1e12 * 0.5, bw = g * t->mem_GBps * 1e9 * 0.8;
    out->a = 2 * m->params / flops;
    out->b = m->kv_bytes_tok * 1024 / bw;
    out->c = m->bytes / bw + 0.002 + (g > 1 ? 0.0005 : 0);
    out->corr = 1;
}

void sim_config_default(struct sim_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_types = 1;
    c->types[0] = gpus[0];
    c->type_gpus[0] = 32;
    c->gpus_per_server = 8;
    c->tiers = (struct sim_tiers){.nvlink_Bps = 450e9,
                                  .nic_Bps = 400e9 / 8,
                                  .pcie_Bps = 25e9,
                                  .ssd_Bps = 6e9,
                                  .remote_Bps = 2.5e9,
                                  .latency_s = 2e-6};
    c->model = models[0];
    c->fail_prob = 0.01;
    c->initial_replicas = 1;
    c->keep_alive_s = 30;
    c->tick_s = 0.1;
    c->max_step_tokens = 1024;
    c->max_seqs = 128;
    c->max_joiners = 16;
    c->ttft_floor_ms = 300;
    c->ttft_per_tok_ms = 0.375;
    c->seed = 1;
    c->send_to = -1;
    c->fc_period_ms = 500;
    c->fc_alpha = 0.3;
    c->fc_beta = 0.1;
    c->fc_z = 0;
    c->fc_z_in = 0;
    c->fc_fast_ms = 300;
    c->onset_ratio = 1.5;
    c->fc_queue = 0;
    c->util_high = 1.3;
    c->util_low = 0.9;
    c->standby_max = 4;
    c->sllm_target = 2;
    c->sllm_max_queue = 10;
    c->sllm_keep_alive_s = 0;
}
