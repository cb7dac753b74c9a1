/* layer_progress: how much of the model a node holds, for /health, /metrics and the serve log.
 *
 * Written by the fabric thread as weight spans verify (and as bytes arrive), read by the HTTP
 * front at any time: every field is an atomic, so a reader sees a slightly torn but monotone
 * snapshot. layers_resident is k, the number of consecutive transformer blocks [0, k) held with
 * the embedding (what a joiner can run itself); the head is the last span, so k = layers_total
 * only says the blocks are here, state READY says everything is.
 *
 * State: LOADING (nothing to run yet), PARTIAL (the embedding and k >= 0 blocks: serves with a
 * helper that holds the rest), READY (every span: serves alone), FAILED (see the log). */
#ifndef STRATA_LAYER_PROGRESS_H
#define STRATA_LAYER_PROGRESS_H

#include "serving/engine/model.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum lp_state { LP_LOADING, LP_PARTIAL, LP_READY, LP_FAILED };

struct layer_progress {
    atomic_int state;
    atomic_int layers_total, layers_resident; /* k */
    atomic_int spans_total, spans_verified;
    atomic_ullong bytes, bytes_total; /* weight bytes received so far / of the image */
    double t0;                        /* monotonic seconds at the join (first byte asked) */
    /* per span (model.h order): its bytes and the time from t0 to its verification (0: not yet) */
    atomic_ullong span_bytes[MODEL_MAX_LAYERS + 2];
    atomic_ullong span_us[MODEL_MAX_LAYERS + 2];
    /* layer_progress_report's own (its caller's thread: the one driving the stream) */
    double report_t;
    int report_done;
};

void layer_progress_init(struct layer_progress *lp);
/* The model is known: n_layers blocks, n_spans spans, image bytes. */
void layer_progress_plan(struct layer_progress *lp, int n_layers, int n_spans, uint64_t image);
/* Span s (bytes long) verified; k is the new count of resident blocks. */
void layer_progress_span(struct layer_progress *lp, int s, uint64_t bytes, int k);
/* Everything is here from the start (a node that loaded its model from a file). */
void layer_progress_full(struct layer_progress *lp, int n_layers, int n_spans, uint64_t image);
const char *layer_progress_state_name(int state);
/* Adds "layers_resident", "layers_total", "bytes", "bytes_total", "state" to a cJSON object. */
struct cJSON;
void layer_progress_json(const struct layer_progress *lp, struct cJSON *o);
/* Prometheus text: gauges of the state and counts, per-layer bytes and seconds. malloc'd. */
char *layer_progress_prom(const struct layer_progress *lp, size_t *len);
/* The console while weights stream: call it as often as you like from the thread that drives the
 * stream; it logs at most one line a second ("weights: 7/24 layers, 45.2 of 111.0 MB, 12.3 MB/s,
 * ETA 5.4 s"), the first a second after the join, and one line when every span is here. */
void layer_progress_report(struct layer_progress *lp);
/* That line: k of L layers, bytes of total at rate bytes/s (the mean since the join; a negative
 * elapsed: the final line, elapsed seconds since the join). Exposed for the test. */
void layer_progress_line(char *out, size_t cap, int k, int L, uint64_t bytes, uint64_t total,
                         double rate, double elapsed);

#endif
