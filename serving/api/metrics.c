#include "serving/api/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double latency_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
static const double token_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                      0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};

static void hist_init(struct histogram *h, const char *name, const char *help, const double *b,
                      int n)
{
    memset(h, 0, sizeof *h);
    h->name = name;
    h->help = help;
    h->bounds = b;
    h->n = n;
}

void metrics_init(struct serve_metrics *m)
{
    memset(m, 0, sizeof *m);
    int nl = (int)(sizeof latency_bounds / sizeof latency_bounds[0]);
    int nt = (int)(sizeof token_bounds / sizeof token_bounds[0]);
    hist_init(&m->ttft, "strata_time_to_first_token_seconds", "Time from arrival to first token.",
              latency_bounds, nl);
    hist_init(&m->tpot, "strata_request_time_per_output_token_seconds",
              "Mean time between output tokens of a request.", token_bounds, nt);
    hist_init(&m->e2e, "strata_e2e_request_latency_seconds", "Time from arrival to last token.",
              latency_bounds, nl);
    hist_init(&m->queue, "strata_request_queue_time_seconds",
              "Time from arrival to first admission.", latency_bounds, nl);
    hist_init(&m->step, "strata_step_seconds", "Duration of one model step.", token_bounds, nt);
}

void metrics_request(struct serve_metrics *m, enum req_outcome o)
{
    atomic_fetch_add_explicit(&m->requests[o], 1, memory_order_relaxed);
}

void hist_observe(struct histogram *h, double s)
{
    int i = 0;
    while (i < h->n && s > h->bounds[i]) i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    unsigned long long us = s > 0 ? (unsigned long long)(s * 1e6 + 0.5) : 0;
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

struct out {
    char *p;
    size_t n, cap;
};

static void outf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(struct out *o, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->p ? o->p + o->n : NULL, o->p ? o->cap - o->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (o->p && o->n + (size_t)k < o->cap) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = (o->cap + (size_t)k + 1) * 2;
        char *p = realloc(o->p, cap);
        if (!p) return;
        o->p = p;
        o->cap = cap;
    }
}

static unsigned long long ld(atomic_ullong *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void counter(struct out *o, const char *name, const char *help, atomic_ullong *v)
{
    outf(o, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, ld(v));
}

static void gauge(struct out *o, const char *name, const char *help, atomic_int *v)
{
    outf(o, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name,
         atomic_load_explicit(v, memory_order_relaxed));
}

static void hist(struct out *o, struct histogram *h)
{
    outf(o, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    /* Buckets are read first and the count is their sum, so the text is self-consistent. */
    unsigned long long cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += ld(&h->counts[i]);
        if (i < h->n)
            outf(o, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->bounds[i], cum);
        else
            outf(o, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, cum);
    }
    outf(o, "%s_sum %.6f\n%s_count %llu\n", h->name, (double)ld(&h->sum_us) / 1e6, h->name, cum);
}

char *metrics_render(struct serve_metrics *m, size_t *len)
{
    static const char *names[OUTCOME_N] = {"stop",    "length",   "cancelled",
                                           "invalid", "rejected", "error"};
    struct out o = {0};
    outf(&o, "# HELP strata_requests_total Requests by outcome.\n"
             "# TYPE strata_requests_total counter\n");
    for (int i = 0; i < OUTCOME_N; i++)
        outf(&o, "strata_requests_total{outcome=\"%s\"} %llu\n", names[i], ld(&m->requests[i]));
    counter(&o, "strata_prompt_tokens_total", "Prompt tokens of admitted requests.",
            &m->prompt_tokens);
    counter(&o, "strata_prompt_cached_tokens_total",
            "Prompt tokens of admitted requests whose KV came from the prefix cache.",
            &m->prompt_cached_tokens);
    counter(&o, "strata_generation_tokens_total", "Completion tokens delivered.",
            &m->generated_tokens);
    counter(&o, "strata_goodput_tokens_total",
            "Completion tokens of requests that met their TTFT and TPOT targets.",
            &m->goodput_tokens);
    counter(&o, "strata_slo_met_total", "Finished requests that met their SLOs.", &m->slo_met);
    counter(&o, "strata_slo_missed_total", "Finished requests that missed an SLO.", &m->slo_missed);
    counter(&o, "strata_num_preemptions_total", "Sequences preempted for KV blocks (recomputed).",
            &m->preemptions);
    counter(&o, "strata_steps_total", "Model steps run.", &m->steps);
    counter(&o, "strata_step_tokens_total", "Tokens computed in model steps.", &m->step_tokens);
    hist(&o, &m->ttft);
    hist(&o, &m->tpot);
    hist(&o, &m->e2e);
    hist(&o, &m->queue);
    hist(&o, &m->step);
    gauge(&o, "strata_num_requests_running", "Sequences in the running batch.", &m->running);
    gauge(&o, "strata_num_requests_waiting", "Requests waiting for admission.", &m->waiting);
    gauge(&o, "strata_kv_blocks_used", "KV-cache blocks in use.", &m->kv_blocks_used);
    gauge(&o, "strata_kv_blocks_total", "KV-cache blocks in the pool.", &m->kv_blocks_total);
    int used = atomic_load_explicit(&m->kv_blocks_used, memory_order_relaxed);
    int total = atomic_load_explicit(&m->kv_blocks_total, memory_order_relaxed);
    outf(&o,
         "# HELP strata_kv_cache_usage_perc KV-cache blocks in use, 0 to 1 (1 = full).\n"
         "# TYPE strata_kv_cache_usage_perc gauge\nstrata_kv_cache_usage_perc %.4f\n",
         total > 0 ? (double)used / total : 0.0);
    outf(&o,
         "# HELP strata_slo_ttft_seconds The default TTFT target (--ttft-ms).\n"
         "# TYPE strata_slo_ttft_seconds gauge\nstrata_slo_ttft_seconds %.6f\n"
         "# HELP strata_slo_tpot_seconds The default time-per-output-token target (--tpot-ms).\n"
         "# TYPE strata_slo_tpot_seconds gauge\nstrata_slo_tpot_seconds %.6f\n",
         (double)ld(&m->slo_ttft_us) / 1e6, (double)ld(&m->slo_tpot_us) / 1e6);
    gauge(&o, "strata_http_connections", "Open HTTP connections.", &m->connections);
    gauge(&o, "strata_coop_k", "Layers this node runs itself per step (the rest on a helper).",
          &m->coop_k);
    gauge(&o, "strata_coop_embedding_remote",
          "1 while the embedding table has not arrived: steps go to the helper as token ids.",
          &m->coop_embedding_remote);
    gauge(&o, "strata_coop_remote_sequences",
          "Other nodes' sequences whose KV this node keeps (helper).", &m->coop_remote_seqs);
    counter(&o, "strata_coop_partial_tokens_total",
            "Tokens served while some layers ran on a helper.", &m->coop_partial_tokens);
    counter(&o, "strata_coop_remote_steps_total", "Steps whose upper layers ran on a helper.",
            &m->coop_remote_steps);
    counter(&o, "strata_coop_pipelined_steps_total",
            "Of those, steps sent while the one before was still at the helper (--coop-pipeline).",
            &m->coop_pipelined_steps);
    counter(&o, "strata_coop_remote_rows_total", "Token rows sent to a helper.",
            &m->coop_remote_rows);
    counter(&o, "strata_coop_token_rows_total",
            "Token rows sent to a helper as token ids (the embedding not here yet).",
            &m->coop_token_rows);
    counter(&o, "strata_coop_served_steps_total", "Steps run for other nodes (helper).",
            &m->coop_served_steps);
    counter(&o, "strata_coop_served_rows_total", "Token rows run for other nodes (helper).",
            &m->coop_served_rows);
    counter(&o, "strata_coop_fused_steps_total",
            "Of the steps run for other nodes, those fused into one of our own (helper).",
            &m->coop_fused_steps);
    counter(&o, "strata_coop_fused_rows_total", "Token rows of those fused steps (helper).",
            &m->coop_fused_rows);
    counter(&o, "strata_coop_fused_late_layers_total",
            "Layers that fused steps arriving after their first layer ran alone to catch up "
            "(helper).",
            &m->coop_fused_late_layers);
    counter(&o, "strata_coop_fill_layers_total",
            "Layers x sequences whose KV was recomputed when layers became local.",
            &m->coop_fill_layers);
    counter(&o, "strata_coop_kv_layers_total",
            "Layers x sequences whose KV was transferred from the helper when layers became local.",
            &m->coop_kv_layers);
    counter(&o, "strata_coop_kv_bytes_total", "KV bytes received from a helper (joiner).",
            &m->coop_kv_bytes);
    counter(&o, "strata_coop_kv_served_bytes_total", "KV bytes sent to joiners (helper).",
            &m->coop_kv_served_bytes);
    if (len) *len = o.n;
    return o.p;
}
