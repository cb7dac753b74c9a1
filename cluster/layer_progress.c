#include "cluster/layer_progress.h"

#include "os/runtime/clock.h"
#include "os/runtime/log.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void layer_progress_init(struct layer_progress *lp)
{
    memset(lp, 0, sizeof *lp);
    atomic_store(&lp->state, LP_LOADING);
    lp->t0 = clock_now();
}

void layer_progress_plan(struct layer_progress *lp, int n_layers, int n_spans, uint64_t image)
{
    atomic_store(&lp->layers_total, n_layers);
    atomic_store(&lp->spans_total, n_spans);
    atomic_store(&lp->bytes_total, image);
}

void layer_progress_span(struct layer_progress *lp, int s, uint64_t bytes, int k)
{
    if (s < 0 || s >= MODEL_MAX_LAYERS + 2) return;
    atomic_store(&lp->span_bytes[s], bytes);
    uint64_t us = (uint64_t)((clock_now() - lp->t0) * 1e6);
    atomic_store(&lp->span_us[s], us ? us : 1);
    int n = atomic_fetch_add(&lp->spans_verified, 1) + 1;
    atomic_store(&lp->layers_resident, k);
    /* Partial from the embedding on: with a helper the node serves from there (k may be 0). */
    int partial = k > 0 || atomic_load(&lp->span_us[0]) != 0;
    int state = n >= atomic_load(&lp->spans_total) ? LP_READY : partial ? LP_PARTIAL : LP_LOADING;
    atomic_store(&lp->state, state);
}

void layer_progress_full(struct layer_progress *lp, int n_layers, int n_spans, uint64_t image)
{
    layer_progress_plan(lp, n_layers, n_spans, image);
    atomic_store(&lp->spans_verified, n_spans);
    atomic_store(&lp->layers_resident, n_layers);
    atomic_store(&lp->bytes, image);
    atomic_store(&lp->state, LP_READY);
}

const char *layer_progress_state_name(int state)
{
    switch (state) {
    case LP_LOADING:
        return "loading";
    case LP_PARTIAL:
        return "partial";
    case LP_READY:
        return "ready";
    default:
        return "failed";
    }
}

void layer_progress_json(const struct layer_progress *lp, struct cJSON *o)
{
    cJSON_AddNumberToObject(o, "layers_resident", atomic_load(&lp->layers_resident));
    cJSON_AddNumberToObject(o, "layers_total", atomic_load(&lp->layers_total));
    cJSON_AddNumberToObject(o, "bytes", (double)atomic_load(&lp->bytes));
    cJSON_AddNumberToObject(o, "bytes_total", (double)atomic_load(&lp->bytes_total));
    cJSON_AddStringToObject(o, "state", layer_progress_state_name(atomic_load(&lp->state)));
}

struct out {
    char *p;
    size_t n, cap;
    int failed;
};

static void outf(struct out *o, const char *fmt, ...)
{
    if (o->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->p + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->failed = 1;
            return;
        }
        if (o->n + (size_t)k < o->cap) {
            o->n += (size_t)k;
            return;
        }
        size_t cap = (o->cap + (size_t)k + 1) * 2;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->failed = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
}

char *layer_progress_prom(const struct layer_progress *lp, size_t *len)
{
    struct out o = {malloc(4096), 0, 4096, 0};
    if (!o.p) return NULL;
    o.p[0] = 0;
    int state = atomic_load(&lp->state), spans = atomic_load(&lp->spans_total);
    outf(&o,
         "# HELP strata_layers_resident Consecutive transformer blocks held with the embedding.\n"
         "# TYPE strata_layers_resident gauge\nstrata_layers_resident %d\n"
         "# HELP strata_layers_total Transformer blocks of the model.\n"
         "# TYPE strata_layers_total gauge\nstrata_layers_total %d\n"
         "# HELP strata_weight_bytes_received Weight bytes received (or loaded) so far.\n"
         "# TYPE strata_weight_bytes_received gauge\nstrata_weight_bytes_received %llu\n"
         "# HELP strata_weight_bytes_total Bytes of the weight image.\n"
         "# TYPE strata_weight_bytes_total gauge\nstrata_weight_bytes_total %llu\n"
         "# HELP strata_weights_state 1 for the node's weight state.\n"
         "# TYPE strata_weights_state gauge\n",
         atomic_load(&lp->layers_resident), atomic_load(&lp->layers_total),
         (unsigned long long)atomic_load(&lp->bytes),
         (unsigned long long)atomic_load(&lp->bytes_total));
    for (int s = LP_LOADING; s <= LP_FAILED; s++)
        outf(&o, "strata_weights_state{state=\"%s\"} %d\n", layer_progress_state_name(s),
             s == state);
    outf(&o, "# HELP strata_span_bytes Bytes of each weight span (0 embedding, 1..L blocks, L+1 "
             "head) once verified.\n# TYPE strata_span_bytes gauge\n");
    for (int s = 0; s < spans && s < MODEL_MAX_LAYERS + 2; s++)
        outf(&o, "strata_span_bytes{span=\"%d\"} %llu\n", s,
             (unsigned long long)atomic_load(&lp->span_bytes[s]));
    outf(&o, "# HELP strata_span_resident_seconds Seconds from the join to each span's "
             "verification (0: not yet).\n# TYPE strata_span_resident_seconds gauge\n");
    for (int s = 0; s < spans && s < MODEL_MAX_LAYERS + 2; s++)
        outf(&o, "strata_span_resident_seconds{span=\"%d\"} %.6f\n", s,
             atomic_load(&lp->span_us[s]) * 1e-6);
    if (o.failed) {
        free(o.p);
        return NULL;
    }
    *len = o.n;
    return o.p;
}

void layer_progress_line(char *out, size_t cap, int k, int L, uint64_t bytes, uint64_t total,
                         double rate, double elapsed)
{
    double mb = (double)bytes / 1e6, total_mb = (double)total / 1e6;
    if (elapsed >= 0) {
        snprintf(out, cap, "weights: %d/%d layers, %.1f MB in %.1f s (%.1f MB/s)", k, L, mb,
                 elapsed, elapsed > 0 ? mb / elapsed : 0);
        return;
    }
    if (!total) {
        snprintf(out, cap, "weights: waiting for the header, %.1f MB, %.1f MB/s", mb, rate / 1e6);
        return;
    }
    char eta[32] = "ETA ?";
    if (rate > 0 && bytes <= total) snprintf(eta, sizeof eta, "ETA %.1f s", (total - bytes) / rate);
    snprintf(out, cap, "weights: %d/%d layers, %.1f of %.1f MB, %.1f MB/s, %s", k, L, mb, total_mb,
             rate / 1e6, eta);
}

void layer_progress_report(struct layer_progress *lp)
{
    double now = clock_now();
    int state = atomic_load(&lp->state);
    uint64_t bytes = atomic_load(&lp->bytes);
    char line[160];
    if (state == LP_FAILED || lp->report_done) return;
    if (state == LP_READY) {
        lp->report_done = 1;
        layer_progress_line(line, sizeof line, atomic_load(&lp->layers_resident),
                            atomic_load(&lp->layers_total), bytes, atomic_load(&lp->bytes_total), 0,
                            now - lp->t0);
        log_info("fabric", "%s", line);
        return;
    }
    if (!lp->report_t) lp->report_t = lp->t0;
    double dt = now - lp->report_t;
    if (dt < 1.0) return;
    /* The mean since the join: bytes land a span at a time, so a one-second rate jumps between
     * 0 and twice the pace; the mean gives an ETA that counts down. */
    layer_progress_line(line, sizeof line, atomic_load(&lp->layers_resident),
                        atomic_load(&lp->layers_total), bytes, atomic_load(&lp->bytes_total),
                        (double)bytes / (now - lp->t0), -1);
    lp->report_t = now;
    log_info("fabric", "%s", line);
}
