#include "cluster/weight_node.h"

#include "cluster/stream_loader.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "transport/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEW_HOLDERS 8

struct weight_node {
    struct weight_node_config cfg;
    struct stream_loader sl;
    struct weight_stream *ws;
    struct fabric_node *fn;
    atomic_int failed, served;
    int joiner, done_logged;
    char fail_msg[ERRMSG_LEN];
    /* holders weight_node_add_holder announced, for the fabric thread (under mu) */
    pthread_mutex_t mu;
    char holder[MAX_NEW_HOLDERS][64];
    int n_holder;
};

void weight_node_add_holder(struct weight_node *wn, const char *addr)
{
    if (!wn || !wn->joiner) return;
    pthread_mutex_lock(&wn->mu);
    int dup = 0;
    for (int i = 0; i < wn->n_holder; i++) dup |= !strcmp(wn->holder[i], addr);
    if (!dup && wn->n_holder < MAX_NEW_HOLDERS)
        snprintf(wn->holder[wn->n_holder++], sizeof wn->holder[0], "%s", addr);
    pthread_mutex_unlock(&wn->mu);
}

/* Fabric thread: the holders announced since last round, to the stream. */
static void take_holders(struct weight_node *wn)
{
    char h[MAX_NEW_HOLDERS][64];
    pthread_mutex_lock(&wn->mu);
    int n = wn->n_holder;
    memcpy(h, wn->holder, sizeof h);
    wn->n_holder = 0;
    pthread_mutex_unlock(&wn->mu);
    for (int i = 0; i < n; i++) {
        if (weight_stream_add_peer(wn->ws, h[i]))
            log_warn("fabric", "weights: cannot add holder %s (the peer list is full)", h[i]);
        else if (!weight_stream_finished(wn->ws))
            log_info("fabric", "weights: %s holds the model: pulling from it next, now", h[i]);
    }
}

static void on_resident(void *ctx, int k)
{
    struct weight_node *wn = ctx;
    if (wn->cfg.on_resident) wn->cfg.on_resident(wn->cfg.ctx, k);
}

static void on_embedding(void *ctx)
{
    struct weight_node *wn = ctx;
    if (wn->cfg.on_embedding) wn->cfg.on_embedding(wn->cfg.ctx);
}

static void on_complete(void *ctx)
{
    struct weight_node *wn = ctx;
    if (wn->cfg.on_complete) wn->cfg.on_complete(wn->cfg.ctx);
}

/* Fabric thread: a joiner opened a connection to us; the weight stream takes it over. */
static int on_join(void *ctx, struct fabric_node *fn, int peer, const uint8_t *msg, size_t len)
{
    struct weight_node *wn = ctx;
    struct tp_conn *c = fabric_node_adopt(fn, peer);
    if (!c) return -1;
    weight_stream_adopt(wn->ws, c, msg, len);
    return 0;
}

/* Fabric thread, every round. */
static void poll_stream(void *ctx, struct fabric_node *fn)
{
    (void)fn;
    struct weight_node *wn = ctx;
    if (atomic_load(&wn->failed)) return;
    char err[ERRMSG_LEN];
    if (wn->joiner) take_holders(wn);
    if (weight_stream_step(wn->ws, err)) {
        snprintf(wn->fail_msg, sizeof wn->fail_msg, "%s", err);
        atomic_store(&wn->failed, 1);
        atomic_store(&wn->cfg.lp->state, LP_FAILED);
        log_error("fabric", "weights: %s", err);
        return;
    }
    if (wn->joiner) {
        const struct weight_stream_stats *st = weight_stream_stats(wn->ws);
        atomic_store(&wn->cfg.lp->bytes, st->bytes_rx);
        layer_progress_report(wn->cfg.lp);
        if (weight_stream_finished(wn->ws) && !wn->done_logged) {
            wn->done_logged = 1;
            log_info("fabric", "weights: %llu bytes received, %llu resumes, %llu refetches",
                     (unsigned long long)st->bytes_rx, (unsigned long long)st->resumes,
                     (unsigned long long)st->refetches);
        }
    }
    atomic_store(&wn->served, weight_stream_served(wn->ws));
}

static struct weight_node *node_new(const struct weight_node_config *cfg, int joiner, char *err)
{
    struct weight_node *wn = calloc(1, sizeof *wn);
    if (!wn) {
        errmsg_set(err, "weight node: out of memory");
        return NULL;
    }
    wn->cfg = *cfg;
    wn->fn = cfg->fabric;
    wn->joiner = joiner;
    pthread_mutex_init(&wn->mu, NULL);
    return wn;
}

static int node_attach(struct weight_node *wn, char *err)
{
    struct weight_stream_config wc = {
        .t = fabric_node_tp(wn->fn),
        .store = &wn->sl.store,
        .peers = wn->joiner ? wn->cfg.peers : NULL,
        .n_peers = wn->joiner ? wn->cfg.n_peers : 0,
        .chunk_size = wn->cfg.chunk_size,
        .rate_bytes = wn->cfg.rate_bytes,
        .corrupt_unit = -1,
        .no_accept = 1,
    };
    if (!(wn->ws = weight_stream_new(&wc, err))) return -1;
    if (fabric_node_on(wn->fn, MSG_JOIN, on_join, wn) ||
        fabric_node_add_poller(wn->fn, poll_stream, wn))
        return errmsg_set(err, "weight node: cannot register on the fabric node");
    return 0;
}

struct weight_node *weight_node_source(const struct weight_node_config *cfg,
                                       struct loaded_model *lm, const char *name, char *err)
{
    struct weight_node *wn = node_new(cfg, 0, err);
    if (!wn) return NULL;
    if (stream_loader_source(&wn->sl, lm, name, cfg->chunk_size, cfg->lp, err)) goto fail;
    struct tp *t = fabric_node_tp(cfg->fabric);
    if (tp_can_expose(t)) {
        char xerr[ERRMSG_LEN];
        if (tp_expose(t, lm->weights, (size_t)lm->model.image_size, xerr)) {
            if (tp_can_pull(t)) {
                errmsg_set(err, "%s", xerr);
                goto fail;
            }
            log_warn("fabric", "%s", xerr);
        }
    }
    /* The engine's own layouts, peers getting GGUF's bytes; not where they read the arena. */
    wn->sl.keep_gguf = tp_can_pull(t);
    if (stream_loader_repack(&wn->sl, err)) goto fail;
    if (node_attach(wn, err)) goto fail;
    log_info("fabric", "weights: offering %s (%d spans, %.1f MiB) to joiners", name,
             lm->model.n_spans, lm->model.image_size / 1048576.0);
    return wn;
fail:
    weight_node_free(wn);
    return NULL;
}

struct weight_node *weight_node_joiner(const struct weight_node_config *cfg,
                                       struct loaded_model *lm, const struct loader_opts *lo,
                                       char *err)
{
    if (cfg->n_peers < 1) {
        errmsg_set(err, "weight node: a joiner needs peers to pull from");
        return NULL;
    }
    struct weight_node *wn = node_new(cfg, 1, err);
    if (!wn) return NULL;
    stream_loader_joiner(&wn->sl, lm, lo, cfg->lp);
    wn->sl.keep_gguf = tp_can_pull(fabric_node_tp(cfg->fabric));
    wn->sl.on_resident = on_resident;
    wn->sl.on_embedding = on_embedding;
    wn->sl.on_complete = on_complete;
    wn->sl.ctx = wn;
    if (node_attach(wn, err)) {
        weight_node_free(wn);
        return NULL;
    }
    log_info("fabric", "weights: pulling from %d peer(s), first %s", cfg->n_peers, cfg->peers[0]);
    return wn;
}

void weight_node_free(struct weight_node *wn)
{
    if (!wn) return;
    weight_stream_free(wn->ws);
    stream_loader_free(&wn->sl);
    pthread_mutex_destroy(&wn->mu);
    free(wn);
}

void weight_node_step(struct weight_node *wn)
{
    poll_stream(wn, wn->fn);
}

int weight_node_embedding_ready(const struct weight_node *wn)
{
    return stream_loader_embedding(&wn->sl);
}

int weight_node_engine_ready(const struct weight_node *wn)
{
    return atomic_load(&wn->sl.engine_ready);
}

int weight_node_k(const struct weight_node *wn)
{
    return stream_loader_k(&wn->sl);
}

int weight_node_complete(const struct weight_node *wn)
{
    return atomic_load(&wn->cfg.lp->state) == LP_READY;
}

const char *weight_node_failed(const struct weight_node *wn)
{
    return atomic_load(&wn->failed) ? wn->fail_msg : NULL;
}

int weight_node_served(const struct weight_node *wn)
{
    return atomic_load(&wn->served);
}
