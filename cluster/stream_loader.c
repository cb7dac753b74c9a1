#include "cluster/stream_loader.h"

#include "cluster/manifest_check.h"

#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The store's read_image: what peers get is GGUF's bytes, whatever the engine rewrote. */
static void read_gguf(void *ctx, uint64_t off, uint32_t len, uint8_t *out)
{
    struct stream_loader *sl = ctx;
    engine_read_gguf(&sl->lm->engine, sl->lm->weights, off, len, out);
}

/* Span s is here and verified, nobody reads it yet: into the engine's layouts (this thread). */
static void repack_span(struct stream_loader *sl, int span)
{
    char err[ERRMSG_LEN];
    double t0 = now_s();
    int n = engine_repack_span(&sl->lm->engine, span, 0, err);
    if (n < 0)
        log_warn("loader", "%s: span %d stays in GGUF's layout: %s", sl->name, span, err);
    else
        sl->repacked += n;
    double dt = now_s() - t0;
    sl->repack_s += dt;
    if (dt > sl->repack_max_s) sl->repack_max_s = dt;
}

/* Header verified: plan, check, start the engine; the weight pool becomes the stream's image. */
static uint8_t *alloc_image(void *ctx, uint64_t size, char *err)
{
    struct stream_loader *sl = ctx;
    const struct weight_store *s = &sl->store;
    snprintf(sl->name, sizeof sl->name, "%s", s->man->name);
    if (loader_open_header(sl->lm, sl->name, s->header, (size_t)s->man->header_len, &sl->opts, err))
        return NULL;
    if (stream_loader_check_manifest(&sl->lm->model, s->man, err) ||
        sl->lm->model.image_size != size) {
        loader_close(sl->lm);
        return NULL;
    }
    if (loader_start(sl->lm, err)) {
        loader_close(sl->lm);
        return NULL;
    }
    const struct model_config *c = &sl->lm->model.cfg;
    if (sl->lp) layer_progress_plan(sl->lp, c->n_layers, sl->lm->model.n_spans, size);
    if (!sl->keep_gguf && engine_repacks(&sl->lm->engine)) {
        sl->store.read_image = read_gguf;
        sl->store.read_ctx = sl;
        sl->lm->engine.lim.keep_layout = 0; /* it will not keep it: each span as it lands */
    }
    log_info("loader",
             "%s: %d layers, dim %d, %d heads (%d kv), vocab %d; engine started, weights arriving "
             "into the arena (%.1f MiB)",
             sl->name, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->vocab_size,
             size / 1048576.0);
    atomic_store(&sl->engine_ready, 1);
    return sl->lm->weights;
}

static int count_k(const struct stream_loader *sl)
{
    if (!weight_store_span_ready(&sl->store, 0)) return 0;
    int L = sl->lm->model.cfg.n_layers, k = 0;
    while (k < L && weight_store_span_ready(&sl->store, 1 + k)) k++;
    return k;
}

static void on_span(void *ctx, int span)
{
    struct stream_loader *sl = ctx;
    if (sl->store.read_image) repack_span(sl, span); /* before anything says it is here */
    int L = sl->lm->model.cfg.n_layers, k = count_k(sl), old = atomic_load(&sl->k);
    /* The head is the last span: until it is here the helper runs it, so k stays below L. */
    if (!weight_store_complete(&sl->store) && k >= L) k = L - 1;
    if (sl->lp) layer_progress_span(sl->lp, span, sl->store.man->span[span].size, k);
    if (sl->lm->engine.be && sl->lm->engine.be->upload_span) {
        char err[ERRMSG_LEN];
        if (sl->lm->engine.be->upload_span(&sl->lm->engine, span, err))
            log_warn("loader", "span %d: device upload: %s", span, err);
    }
    if (span == 0) {
        atomic_store(&sl->embedding, 1);
        log_info("loader", "%s: the embedding is here", sl->name);
        if (sl->on_embedding) sl->on_embedding(sl->ctx);
    }
    if (k > old) {
        atomic_store(&sl->k, k);
        log_info("loader", "%s: %d/%d layers resident", sl->name, k, L);
        if (sl->on_resident) sl->on_resident(sl->ctx, k);
    }
    if (weight_store_complete(&sl->store)) {
        atomic_store(&sl->complete, 1);
        log_info("loader", "%s: every span verified: serving alone", sl->name);
        if (sl->repacked)
            log_info("loader",
                     "%s: %d matrices stored in 16-row groups for the %s kernels as they landed "
                     "(%.2f s on this thread, %.3f s the longest span)",
                     sl->name, sl->repacked, matmul_isa_of(&sl->lm->engine.mm), sl->repack_s,
                     sl->repack_max_s);
        if (sl->on_complete) sl->on_complete(sl->ctx);
    }
}

void stream_loader_joiner(struct stream_loader *sl, struct loaded_model *lm,
                          const struct loader_opts *opts, struct layer_progress *lp)
{
    memset(sl, 0, sizeof *sl);
    weight_store_init_empty(&sl->store);
    sl->lm = lm;
    sl->opts = *opts;
    sl->opts.limits.keep_layout = 1;
    sl->opts.progress = NULL;
    sl->lp = lp;
    sl->store.alloc_image = alloc_image;
    sl->store.alloc_ctx = sl;
    sl->store.on_ready = on_span;
    sl->store.ctx = sl;
}

int stream_loader_source(struct stream_loader *sl, struct loaded_model *lm, const char *name,
                         uint32_t chunk_size, struct layer_progress *lp, char *err)
{
    memset(sl, 0, sizeof *sl);
    sl->lm = lm;
    sl->lp = lp;
    snprintf(sl->name, sizeof sl->name, "%s", name);
    const struct model *m = &lm->model;
    if (!lm->lim.keep_layout)
        return errmsg_set(err, "%s: the engine repacked its weights; a source needs keep_layout",
                          name);
    if (m->n_spans > WIRE_MAX_SPANS) return errmsg_set(err, "%s: too many spans", name);
    struct wire_span spans[WIRE_MAX_SPANS];
    for (int i = 0; i < m->n_spans; i++)
        spans[i] = (struct wire_span){m->spans[i].offset, m->spans[i].size, 0};
    if (weight_store_init_full(&sl->store, name, lm->map, lm->gguf.data_offset, lm->weights,
                               m->image_size, spans, (uint32_t)m->n_spans, chunk_size, err))
        return -1;
    atomic_store(&sl->engine_ready, 1);
    atomic_store(&sl->k, m->cfg.n_layers);
    atomic_store(&sl->embedding, 1);
    atomic_store(&sl->complete, 1);
    if (lp) layer_progress_full(lp, m->cfg.n_layers, m->n_spans, m->image_size);
    return 0;
}

int stream_loader_repack(struct stream_loader *sl, char *err)
{
    struct engine *e = &sl->lm->engine;
    if (sl->keep_gguf || !engine_repacks(e)) return 0;
    sl->store.read_image = read_gguf;
    sl->store.read_ctx = sl;
    double t0 = now_s();
    for (int s = 0; s < sl->lm->model.n_spans; s++) {
        int n = engine_repack_span(e, s, 1, err);
        if (n < 0) return errmsg_prefix(err, "%s: ", sl->name);
        sl->repacked += n;
    }
    sl->repack_s = now_s() - t0;
    e->lim.keep_layout = 0;
    if (sl->repacked)
        log_info("loader",
                 "%s: %d matrices stored in 16-row groups for the %s kernels (%.2f s); peers "
                 "receive GGUF's layout",
                 sl->name, sl->repacked, matmul_isa_of(&e->mm), sl->repack_s);
    return 0;
}

void stream_loader_free(struct stream_loader *sl)
{
    weight_store_free(&sl->store);
}

int stream_loader_k(const struct stream_loader *sl)
{
    return atomic_load(&sl->k);
}

int stream_loader_complete(const struct stream_loader *sl)
{
    return atomic_load(&sl->complete);
}

int stream_loader_embedding(const struct stream_loader *sl)
{
    return atomic_load(&sl->embedding);
}
