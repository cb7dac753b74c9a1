/* metrics: the serving counters, gauges and histograms, rendered as Prometheus text (format 0.0.4).
 *
 * Every field is an atomic updated with relaxed ordering by whichever thread sees the event (the
 * scheduler for tokens and latencies, the front for HTTP outcomes), so neither thread waits for
 * the other; /metrics reads a slightly torn but always monotone snapshot. Histograms keep
 * per-bucket counts (rendered cumulative), the count and the sum in microseconds.
 *
 * Goodput counts the completion tokens of requests that met both their TTFT and TPOT targets.
 * Names follow vLLM's where the meaning is the same (strata_ for vllm:), docs/operations.md. */
#ifndef STRATA_METRICS_H
#define STRATA_METRICS_H

#include <stdatomic.h>
#include <stddef.h>

enum req_outcome {
    OUTCOME_STOP,      /* finished, finish_reason "stop" */
    OUTCOME_LENGTH,    /* finished, finish_reason "length" */
    OUTCOME_CANCELLED, /* client went away */
    OUTCOME_INVALID,   /* 4xx: bad request, auth, not found, too large */
    OUTCOME_REJECTED,  /* 503: overloaded, not ready */
    OUTCOME_ERROR,     /* 5xx: our fault */
    OUTCOME_N
};

#define HIST_BUCKETS 16

struct histogram {
    const char *name, *help;
    const double *bounds; /* seconds, ascending, n of them (+Inf implied) */
    int n;
    atomic_ullong counts[HIST_BUCKETS + 1];
    atomic_ullong count, sum_us;
};

struct serve_metrics {
    atomic_ullong requests[OUTCOME_N];
    atomic_ullong prompt_tokens, generated_tokens, goodput_tokens;
    atomic_ullong prompt_cached_tokens; /* of prompt_tokens: taken from the prefix cache */
    atomic_ullong prompt_in; /* prompt tokens submitted (arrivals: the cluster's forecast) */
    atomic_ullong slo_met, slo_missed, preemptions, steps, step_tokens;
    struct histogram ttft, tpot, e2e, queue, step;
    atomic_int running, waiting, kv_blocks_used, kv_blocks_total, connections;
    atomic_ullong slo_ttft_us, slo_tpot_us; /* the default targets (set once at start) */
    /* requests taken while the route found no replica (held in a relay, or served here from a
     * host copy), in flight, and their prompt tokens (the front; cluster/control.h) */
    atomic_int no_replica;
    atomic_llong no_replica_tokens;
    /* cooperative execution (cluster/coop.h); all zero on a node that serves alone */
    atomic_int layers_total, layers_resident, coop_k, coop_remote_seqs;
    atomic_int coop_embedding_remote;  /* joiner: steps go to the helper as token ids */
    atomic_ullong coop_partial_tokens; /* joiner: tokens served while k < L */
    atomic_ullong coop_remote_steps, coop_remote_rows; /* joiner: sent to the helper */
    atomic_ullong coop_pipelined_steps; /* joiner: of those, sent while another was in flight */
    atomic_ullong coop_token_rows;      /* joiner: of those, sent as token ids */
    atomic_ullong coop_served_steps, coop_served_rows; /* helper: run for other nodes */
    atomic_ullong coop_fused_steps, coop_fused_rows;   /* helper: of those, inside our steps */
    atomic_ullong coop_fused_late_layers;              /* helper: layers late ones caught up */
    atomic_ullong coop_fill_layers;                    /* joiner: layer x sequence KV recomputed */
    atomic_ullong coop_kv_layers, coop_kv_bytes;       /* joiner: layer x sequence KV transferred */
    atomic_ullong coop_kv_served_bytes;                /* helper: KV bytes sent to joiners */
};

void metrics_init(struct serve_metrics *m);
void metrics_request(struct serve_metrics *m, enum req_outcome o);
void hist_observe(struct histogram *h, double seconds);
/* malloc'd text; *len its length. */
char *metrics_render(struct serve_metrics *m, size_t *len);

#endif
