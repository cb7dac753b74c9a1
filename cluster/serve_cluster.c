#include "cluster/serve_cluster.h"

#include "cluster/planner.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct serve_cluster {
    _Atomic(struct control *) ctl; /* set once control_start returned */
    struct serve_metrics *m;
    struct scheduler *sched;
    int max_step_tokens;
    char model[CL_STR_LEN + 1];
    int n_layers;
    /* Control thread only: */
    double idle_start, last_t, tok_s;
    unsigned long long last_tokens;
    int joining_k, joining; /* the stand-in executor's scale-up in progress */
    int engine, host;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void load(void *ctx, struct cl_load *out)
{
    struct serve_cluster *sc = ctx;
    struct serve_metrics *m = sc->m;
    double t = now_s();
    int waiting = atomic_load(&m->waiting), running = atomic_load(&m->running);
    int kv_total = atomic_load(&m->kv_blocks_total);
    unsigned long long gen = atomic_load(&m->generated_tokens);
    unsigned long long prompt = atomic_load(&m->prompt_tokens), reqs = 0;
    for (int i = 0; i < OUTCOME_N; i++) reqs += atomic_load(&m->requests[i]);
    memset(out, 0, sizeof *out);
    out->queue_len = waiting;
    out->running = running;
    /* The queue's prompt tokens are not counted separately: the mean prompt so far stands in. */
    out->queued_tokens = (int64_t)waiting * (int64_t)(reqs ? prompt / reqs : 16);
    out->kv_used = kv_total ? (float)atomic_load(&m->kv_blocks_used) / (float)kv_total : 0;
    if (out->kv_used > 1) out->kv_used = 1;
    if (!waiting && !running) {
        if (sc->idle_start <= 0) sc->idle_start = t;
        out->idle_ms = (float)((t - sc->idle_start) * 1e3);
    } else {
        sc->idle_start = 0;
        out->idle_ms = -1;
    }
    if (sc->last_t > 0 && gen > sc->last_tokens && t > sc->last_t) {
        double rate = (double)(gen - sc->last_tokens) / (t - sc->last_t);
        sc->tok_s = sc->tok_s > 0 ? 0.7 * sc->tok_s + 0.3 * rate : rate;
    }
    sc->last_t = t;
    sc->last_tokens = gen;
    out->tok_s = (float)sc->tok_s;
    const struct step_model *sm = sc->sched ? sched_step_model(sc->sched) : NULL;
    if (sm) {
        struct step_model copy = *sm;
        out->step_a = (float)copy.a;
        out->step_b = (float)copy.b;
        out->step_c = (float)copy.c;
        out->step_corr = (float)copy.corr;
        out->ttft_pred_ms =
            (float)planner_drain_ms(&copy, out->queued_tokens + 16, running, sc->max_step_tokens);
    }
    /* The stand-in executor's scale-up: k grows each heartbeat. */
    if (sc->joining && sc->ctl) {
        sc->joining_k += sc->n_layers / 4 ? sc->n_layers / 4 : 1;
        if (sc->joining_k >= sc->n_layers) sc->joining_k = sc->n_layers, sc->joining = 0;
        control_set_holding(sc->ctl, sc->model, sc->host, 1, sc->joining_k, sc->n_layers);
    }
}

/* ---------------------------------------------------------------- the stand-in executor */

static int fake_scale_up(void *ctx, const char *model, uint64_t source, const uint64_t *chain,
                         int n_chain, char *err)
{
    struct serve_cluster *sc = ctx;
    (void)source, (void)chain, (void)n_chain;
    if (!sc->ctl) return errmsg_set(err, "the control thread is still starting");
    if (strcmp(model, sc->model)) return errmsg_set(err, "model %s is not on this node", model);
    sc->joining = 1;
    sc->joining_k = 0;
    sc->engine = 1;
    control_set_holding(sc->ctl, sc->model, sc->host, 1, 0, sc->n_layers);
    return 0;
}

static int fake_scale_down(void *ctx, const char *model, char *err)
{
    struct serve_cluster *sc = ctx;
    if (!sc->ctl) return errmsg_set(err, "the control thread is still starting");
    if (strcmp(model, sc->model)) return errmsg_set(err, "model %s is not on this node", model);
    sc->joining = 0;
    sc->engine = 0;
    control_set_holding(sc->ctl, sc->model, sc->host, 0, 0, sc->n_layers);
    return 0;
}

static int fake_replicate(void *ctx, const char *model, uint64_t source, char *err)
{
    struct serve_cluster *sc = ctx;
    (void)source;
    if (!sc->ctl) return errmsg_set(err, "the control thread is still starting");
    if (strcmp(model, sc->model)) return errmsg_set(err, "model %s is not on this node", model);
    sc->host = 1;
    control_set_holding(sc->ctl, sc->model, 1, sc->engine, sc->engine ? sc->n_layers : 0,
                        sc->n_layers);
    return 0;
}

static int fake_drop_host(void *ctx, const char *model, char *err)
{
    struct serve_cluster *sc = ctx;
    if (!sc->ctl) return errmsg_set(err, "the control thread is still starting");
    if (strcmp(model, sc->model)) return errmsg_set(err, "model %s is not on this node", model);
    sc->host = 0;
    control_set_holding(sc->ctl, sc->model, 0, sc->engine, sc->engine ? sc->n_layers : 0,
                        sc->n_layers);
    return 0;
}

/* ---------------------------------------------------------------- routes */

static char *get_route(void *ctx, const char *path, size_t *len)
{
    struct serve_cluster *sc = ctx;
    if (strcmp(path, "/v1/cluster")) return NULL;
    return control_json(sc->ctl, len);
}

static int route(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                 uint64_t *node, char *err)
{
    struct serve_cluster *sc = ctx;
    return control_route(sc->ctl, model, prompt_tokens, addr, cap, node, err);
}

static char *metrics(void *ctx, size_t *len)
{
    struct serve_cluster *sc = ctx;
    return control_metrics(sc->ctl, len);
}

struct serve_cluster *serve_cluster_start(const struct control_cfg *cfg, struct front *f,
                                          struct serve_metrics *m, struct scheduler *s,
                                          int max_step_tokens, char *err)
{
    struct serve_cluster *sc = calloc(1, sizeof *sc);
    if (!sc) {
        errmsg_set(err, "cluster: out of memory");
        return NULL;
    }
    sc->m = m;
    sc->sched = s;
    sc->max_step_tokens = max_step_tokens;
    snprintf(sc->model, sizeof sc->model, "%s", cfg->model ? cfg->model : "");
    sc->n_layers = cfg->n_layers;
    sc->host = 1;
    sc->engine = !cfg->standby;
    struct control_serving sv = {.ctx = sc, .load = load};
    struct cluster_exec ex = {.ctx = sc,
                              .scale_up = fake_scale_up,
                              .scale_down = fake_scale_down,
                              .replicate = fake_replicate,
                              .drop_host = fake_drop_host};
    struct control *ctl = control_start(cfg, &sv, &ex, err);
    if (!ctl) {
        free(sc);
        return NULL;
    }
    sc->ctl = ctl;
    struct front_ext fx = {
        .ctx = sc, .get = get_route, .metrics = metrics, .route = route, .node_id = cfg->id};
    front_set_ext(f, &fx);
    return sc;
}

void serve_cluster_stop(struct serve_cluster *sc)
{
    if (!sc) return;
    control_stop(sc->ctl);
    free(sc);
}
