#include "cluster/serve_cluster.h"

#include "cluster/coop.h"
#include "cluster/planner.h"
#include "cluster/recover_req.h"
#include "serving/api/api_request.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct serve_cluster {
    _Atomic(struct control *) ctl; /* set once control_start returned */
    struct serve_metrics *m;
    struct front *front;               /* forward channels from members become its connections */
    _Atomic(struct scheduler *) sched; /* NULL while the node has no engine */
    struct coop *coop;                 /* mu: its cooperative execution (hand-overs), NULL none */
    atomic_ullong step_id;             /* its step model's identity (step_identity_hash), 0 */
    atomic_int max_step_tokens;
    atomic_int fresh;     /* an engine just came up: its keep-alive starts now */
    int fake;             /* --cluster-standby: the stand-in executor */
    char test_refuse[16]; /* --test-refuse: "replicate" or "scale-up" decisions are refused */
    /* Guarded by mu: what this node holds, and the job for the main thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char model[CL_STR_LEN + 1]; /* "" : an empty member */
    int n_layers, host, engine, k, joining;
    double bytes; /* the model's */
    /* the latest weight stream into this node: its start, the node it came from, its rate */
    double join_t0;
    uint64_t join_from, link_peer;
    double link_Bps, link_cap; /* measured; configured (control_cfg.link_cap_Bps) */
    int job_pending;
    struct sc_job job;
    /* Control thread only: */
    double idle_start, last_t, tok_s;
    unsigned long long last_tokens;
    int joining_k, fake_joining; /* the stand-in executor's scale-up in progress */
    char holders[SC_MAX_OTHERS + 2][CL_STR_LEN + 1]; /* live whole holders seen last heartbeat */
    int n_holders;
    /* Guarded by mu: the serving process's hook for a holder that (re)appears during a join. */
    void (*on_holder)(void *ctx, const char *fabric, int serves);
    void *holder_ctx;
};

/* Control thread, each heartbeat, while this node joins a model: a live node that holds it whole
 * and was not one last heartbeat (a holder restarted with the file, an operator's `strata serve
 * -m`) is handed to the serving process, which pulls from it and may take it as its helper at
 * once; and a model the cluster lost fails the requests waiting here for a helper that is gone. */
static void watch_join(struct serve_cluster *sc)
{
    struct control *ctl = atomic_load(&sc->ctl);
    char model[CL_STR_LEN + 1], why[ERRMSG_LEN];
    pthread_mutex_lock(&sc->mu);
    int joining = sc->joining && sc->model[0];
    snprintf(model, sizeof model, "%s", sc->model);
    pthread_mutex_unlock(&sc->mu);
    if (!ctl || !joining) {
        sc->n_holders = 0;
        return;
    }
    struct scheduler *sched = atomic_load(&sc->sched);
    if (sched && control_model_lost(ctl, model, why, sizeof why)) sched_fail_all(sched, why);
    char now[SC_MAX_OTHERS + 2][CL_STR_LEN + 1];
    int n = control_holders_fabric(ctl, model, NULL, 0, now, SC_MAX_OTHERS + 2);
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < sc->n_holders; k++) seen |= !strcmp(sc->holders[k], now[i]);
        if (seen) continue;
        int serves = control_fabric_serves(ctl, model, now[i]);
        pthread_mutex_lock(&sc->mu);
        if (sc->on_holder) {
            log_info("cluster", "%s: %s holds it whole%s: pulling from it", model, now[i],
                     serves ? " and serves it" : "");
            sc->on_holder(sc->holder_ctx, now[i], serves);
        }
        pthread_mutex_unlock(&sc->mu);
    }
    memcpy(sc->holders, now, sizeof now);
    sc->n_holders = n;
}

void serve_cluster_on_holder(struct serve_cluster *sc,
                             void (*fn)(void *ctx, const char *fabric, int serves), void *ctx)
{
    pthread_mutex_lock(&sc->mu);
    sc->on_holder = fn;
    sc->holder_ctx = ctx;
    pthread_mutex_unlock(&sc->mu);
}

/* Our holding to the control thread's next report (mu held). */
static void publish(struct serve_cluster *sc)
{
    struct control *ctl = atomic_load(&sc->ctl);
    if (ctl && sc->model[0])
        control_set_holding(ctl, sc->model, sc->host, sc->engine, sc->k, sc->n_layers);
}

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
    out->held = atomic_load(&m->no_replica);
    out->held_tokens = atomic_load(&m->no_replica_tokens);
    if (out->held < 0) out->held = 0;
    if (out->held_tokens < 0) out->held_tokens = 0;
    if (out->held && sc->front) {
        char model[128];
        front_held_model(sc->front, model, sizeof model);
        cluster_cmd_printable(out->held_model, model);
    }
    /* The queue's prompt tokens are not counted separately: the mean prompt so far stands in. */
    out->queued_tokens = (int64_t)waiting * (int64_t)(reqs ? prompt / reqs : 16);
    out->kv_used = kv_total ? (float)atomic_load(&m->kv_blocks_used) / (float)kv_total : 0;
    if (out->kv_used > 1) out->kv_used = 1;
    if (atomic_exchange(&sc->fresh, 0)) sc->idle_start = 0;
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
    out->prompt_in = atomic_load(&m->prompt_in);
    out->helping = atomic_load(&m->coop_remote_seqs);
    if (out->helping < 0) out->helping = 0;
    pthread_mutex_lock(&sc->mu);
    out->model_bytes = sc->model[0] && sc->bytes > 0 ? (uint64_t)sc->bytes : 0;
    out->link_Bps = (float)(sc->link_Bps > 0 ? sc->link_Bps : sc->link_cap);
    out->link_peer = sc->link_Bps > 0 ? sc->link_peer : 0;
    pthread_mutex_unlock(&sc->mu);
    struct scheduler *sched = atomic_load(&sc->sched);
    const struct step_model *sm = sched ? sched_step_model(sched) : NULL;
    if (sm) {
        struct step_model copy = *sm;
        out->step_a = (float)copy.a;
        out->step_b = (float)copy.b;
        out->step_c = (float)copy.c;
        out->step_corr = (float)copy.corr;
        out->step_err = (float)sched_step_err(sched);
        out->step_steps = (uint32_t)atomic_load(&m->steps);
        out->step_cal = sched_calibrated(sched) != 0;
        out->step_id = atomic_load(&sc->step_id);
        out->ttft_pred_ms = (float)planner_drain_ms(&copy, out->queued_tokens + 16, running,
                                                    atomic_load(&sc->max_step_tokens));
    }
    if (!sc->fake) watch_join(sc);
    /* The stand-in executor's scale-up: k grows each heartbeat. */
    if (sc->fake_joining && atomic_load(&sc->ctl)) {
        pthread_mutex_lock(&sc->mu);
        sc->joining_k += sc->n_layers / 4 ? sc->n_layers / 4 : 1;
        if (sc->joining_k >= sc->n_layers) sc->joining_k = sc->n_layers, sc->fake_joining = 0;
        sc->k = sc->joining_k;
        publish(sc);
        pthread_mutex_unlock(&sc->mu);
    }
}

/* ---------------------------------------------------------------- the stand-in executor */

static int fake_scale_up(struct serve_cluster *sc)
{
    sc->fake_joining = 1;
    sc->joining_k = sc->k = 0;
    sc->engine = 1;
    return 0;
}

/* ---------------------------------------------------------------- the executor */

static int busy(char *err)
{
    return errmsg_set(err, "the control thread is still starting");
}

/* A join for the main thread (mu held): the source is the helper; the weights come from the
 * joiner before us in the chain when there is one (it forwards what it verified), else from the
 * source itself. */
static int start_join(struct serve_cluster *sc, const char *model, uint64_t source,
                      const uint64_t *chain, int n_chain, int engine, char *err)
{
    struct control *ctl = atomic_load(&sc->ctl);
    struct sc_job *j = &sc->job;
    memset(j, 0, sizeof *j);
    j->kind = SC_JOB_JOIN;
    j->engine = engine;
    j->source = source;
    snprintf(j->model, sizeof j->model, "%s", model);
    if (control_node_fabric(ctl, source, j->source_fabric))
        return errmsg_set(err, "source node %llu has no fabric address (--listen)",
                          (unsigned long long)source);
    uint64_t up = 0; /* the joiner before us in the chain */
    for (int i = 1; i < n_chain; i++)
        if (chain[i] == control_id(ctl)) up = chain[i - 1];
    if (up && control_node_fabric(ctl, up, j->upstream_fabric))
        log_warn("cluster", "chain: node %llu has no fabric address: pulling from the source",
                 (unsigned long long)up);
    if (sc->model[0] && strcmp(sc->model, model)) { /* a switch: the old model goes first */
        snprintf(j->drop_first, sizeof j->drop_first, "%s", sc->model);
        j->drop_layers = sc->n_layers;
    }
    uint64_t skip[2] = {source, up};
    j->n_other = control_holders_fabric(ctl, model, skip, 2, j->other_fabric, SC_MAX_OTHERS);
    for (int i = 0; i < j->n_other; i++)
        j->other_serves[i] = control_fabric_serves(ctl, model, j->other_fabric[i]);
    snprintf(sc->model, sizeof sc->model, "%s", model);
    sc->join_t0 = now_s();
    sc->join_from = up ? up : source;
    sc->joining = 1;
    sc->engine = engine;
    sc->host = 0;
    sc->k = 0;
    sc->job_pending = 1;
    pthread_cond_broadcast(&sc->cv);
    log_info("cluster", "joining %s: helper node %llu (%s), weights from %s", model,
             (unsigned long long)source, j->source_fabric,
             j->upstream_fabric[0] ? j->upstream_fabric : j->source_fabric);
    return 0;
}

static int check_model(const struct serve_cluster *sc, const char *model, char *err)
{
    if (sc->model[0] && strcmp(model, sc->model))
        return errmsg_set(err, "this node holds %s, not %s (its host copy goes first)", sc->model,
                          model);
    return 0;
}

/* A scale-up to another model than ours: only with ours out of the engine, not arriving, and
 * cached on another live node (on the CPU engine the arena is our host copy: it goes). */
static int check_switch(struct serve_cluster *sc, const char *model, char *err)
{
    if (!sc->model[0] || !strcmp(model, sc->model)) return 0;
    if (sc->engine || sc->joining)
        return errmsg_set(err, "this node serves %s: scale it down before switching to %s",
                          sc->model, model);
    char other[1][CL_STR_LEN + 1];
    if (!control_holders_fabric(atomic_load(&sc->ctl), sc->model, NULL, 0, other, 1))
        return errmsg_set(err, "this node holds the last host copy of %s: not switching to %s",
                          sc->model, model);
    return 0;
}

static int test_refused(const struct serve_cluster *sc, const char *kind, const char *model,
                        char *err)
{
    if (strcmp(sc->test_refuse, kind)) return 0;
    return errmsg_set(err, "--test-refuse %s: not taking %s", kind, model);
}

static int do_scale_up(void *ctx, const char *model, uint64_t source, const uint64_t *chain,
                       int n_chain, char *err)
{
    struct serve_cluster *sc = ctx;
    if (!atomic_load(&sc->ctl)) return busy(err);
    if (test_refused(sc, "scale-up", model, err)) return -1;
    pthread_mutex_lock(&sc->mu);
    int rc = sc->fake ? check_model(sc, model, err) : check_switch(sc, model, err);
    if (!rc && sc->model[0] && strcmp(model, sc->model))
        rc = start_join(sc, model, source, chain, n_chain, 1, err);
    else if (!rc && sc->fake)
        rc = fake_scale_up(sc);
    else if (!rc && sc->host) { /* the whole model is in host memory here: serve it at once */
        sc->engine = 1, sc->k = sc->n_layers;
        if (sc->coop) coop_handover_end(sc->coop); /* sequences handed over come back */
    } else if (!rc && sc->joining)
        sc->engine = 1; /* a replication in progress becomes a scale-up */
    else if (!rc)
        rc = start_join(sc, model, source, chain, n_chain, 1, err);
    /* The engine replica is new: its keep-alive starts now, not when the host copy went idle
     * (else the leader scales it down on the tick after it came up). */
    if (!rc) atomic_store(&sc->fresh, 1);
    if (!rc) publish(sc);
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

static int do_scale_down(void *ctx, const char *model, uint64_t handover, char *err)
{
    struct serve_cluster *sc = ctx;
    struct control *ctl = atomic_load(&sc->ctl);
    if (!ctl) return busy(err);
    char to[CL_STR_LEN + 1] = "", e[ERRMSG_LEN];
    if (handover && control_node_fabric(ctl, handover, to))
        log_warn("cluster", "scale-down: node %llu has no fabric address: no hand-over",
                 (unsigned long long)handover);
    pthread_mutex_lock(&sc->mu);
    int rc = check_model(sc, model, err);
    if (!rc) {
        sc->fake_joining = 0;
        sc->engine = 0;
        if (sc->fake) sc->k = 0;
        publish(sc);
        /* a hand-over: what runs here moves to that replica (cluster/coop.h) */
        if (to[0] && sc->coop && coop_handover(sc->coop, to, e))
            log_warn("cluster", "scale-down of %s: %s (what runs here finishes here)", model, e);
    }
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

static int do_replicate(void *ctx, const char *model, uint64_t source, char *err)
{
    struct serve_cluster *sc = ctx;
    if (!atomic_load(&sc->ctl)) return busy(err);
    if (test_refused(sc, "replicate", model, err)) return -1;
    pthread_mutex_lock(&sc->mu);
    int rc = check_model(sc, model, err);
    if (!rc && sc->fake)
        sc->host = 1;
    else if (!rc && !sc->host && !sc->joining) /* else it is here, or on its way */
        rc = start_join(sc, model, source, NULL, 0, 0, err);
    if (!rc) publish(sc);
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

static int do_drop_host(void *ctx, const char *model, char *err)
{
    struct serve_cluster *sc = ctx;
    if (!atomic_load(&sc->ctl)) return busy(err);
    pthread_mutex_lock(&sc->mu);
    int rc = check_model(sc, model, err);
    if (!rc && sc->engine)
        rc = errmsg_set(err, "%s is in this node's engine: scale it down first", model);
    else if (!rc && sc->joining)
        rc = errmsg_set(err, "%s is still arriving here", model);
    else if (!rc && sc->fake) {
        sc->host = 0;
        publish(sc);
    } else if (!rc && !sc->job_pending) {
        memset(&sc->job, 0, sizeof sc->job);
        sc->job.kind = SC_JOB_DROP;
        snprintf(sc->job.model, sizeof sc->job.model, "%s", model);
        sc->job_pending = 1;
        pthread_cond_broadcast(&sc->cv);
    }
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

/* ---------------------------------------------------------------- the serving process's side */

int serve_cluster_wait_job(struct serve_cluster *sc, struct sc_job *job, atomic_int *stop)
{
    pthread_mutex_lock(&sc->mu);
    while (!sc->job_pending && !atomic_load(stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&sc->cv, &sc->mu, &ts);
    }
    int rc = sc->job_pending ? 0 : -1;
    if (!rc) *job = sc->job;
    sc->job_pending = 0;
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

void serve_cluster_attach(struct serve_cluster *sc, struct scheduler *s, const char *model,
                          int n_layers, double bytes, int max_step_tokens)
{
    struct control *ctl = atomic_load(&sc->ctl);
    control_set_model(ctl, model, n_layers, bytes, max_step_tokens);
    atomic_store(&sc->max_step_tokens, max_step_tokens);
    atomic_store(&sc->sched, s);
    atomic_store(&sc->fresh, 1);
    pthread_mutex_lock(&sc->mu);
    sc->n_layers = n_layers;
    sc->bytes = bytes;
    publish(sc);
    pthread_mutex_unlock(&sc->mu);
}

void serve_cluster_set_coop(struct serve_cluster *sc, struct coop *coop)
{
    pthread_mutex_lock(&sc->mu);
    sc->coop = coop;
    pthread_mutex_unlock(&sc->mu);
}

void serve_cluster_set_step_id(struct serve_cluster *sc, uint64_t id)
{
    atomic_store(&sc->step_id, id);
}

int serve_cluster_member_step(struct serve_cluster *sc, uint64_t id, struct step_model *m,
                              double *err, int *calibrated, uint64_t *node)
{
    struct control *ctl = sc ? atomic_load(&sc->ctl) : NULL;
    return ctl ? control_member_step(ctl, id, m, err, calibrated, node) : 0;
}

void serve_cluster_resident(struct serve_cluster *sc, int k)
{
    pthread_mutex_lock(&sc->mu);
    if (sc->joining && k >= sc->k) {
        sc->k = k;
        if (sc->n_layers && k >= sc->n_layers) {
            sc->host = 1; /* every layer verified: the arena is a whole host copy */
            sc->joining = 0;
            /* the link's rate as this stream measured it: the model over the join's time */
            double t = now_s() - sc->join_t0;
            if (sc->bytes > 0 && t > 0) {
                sc->link_Bps = sc->bytes / t;
                sc->link_peer = sc->join_from;
            }
            log_info("cluster",
                     "%s: every layer here, serving alone (%.0f bytes in %.2f s from node %llu: "
                     "%.3f MB/s)",
                     sc->model, sc->bytes, t, (unsigned long long)sc->join_from,
                     sc->link_Bps / 1e6);
        }
        if (!sc->engine && sc->joining) sc->k = 0; /* a replication reports only the copy */
        publish(sc);
    }
    pthread_mutex_unlock(&sc->mu);
}

void serve_cluster_join_failed(struct serve_cluster *sc, const char *why)
{
    pthread_mutex_lock(&sc->mu);
    log_error("cluster", "joining %s failed: %s", sc->model, why);
    char e[CL_STR_LEN + 1];
    snprintf(e, sizeof e, "join failed: %s", why);
    control_exec_failed(atomic_load(&sc->ctl), sc->model, e); /* the leader abandons it now */
    sc->host = sc->engine = sc->k = sc->joining = 0;
    publish(sc);
    sc->model[0] = 0;
    sc->n_layers = 0;
    pthread_mutex_unlock(&sc->mu);
}

void serve_cluster_switched(struct serve_cluster *sc, const struct sc_job *job)
{
    struct control *ctl = atomic_load(&sc->ctl);
    log_info("cluster", "%s dropped from this node: switching to %s", job->drop_first, job->model);
    control_set_holding(ctl, job->drop_first, 0, 0, 0, job->drop_layers);
}

void serve_cluster_detach(struct serve_cluster *sc)
{
    atomic_store(&sc->sched, NULL);
    serve_cluster_on_holder(sc, NULL, NULL);
    atomic_store(&sc->step_id, 0);
    serve_cluster_set_coop(sc, NULL);
}

void serve_cluster_dropped(struct serve_cluster *sc)
{
    pthread_mutex_lock(&sc->mu);
    log_info("cluster", "%s: host copy dropped, this node is empty", sc->model);
    sc->host = sc->engine = sc->k = sc->joining = 0;
    publish(sc);
    sc->model[0] = 0;
    sc->n_layers = 0;
    pthread_mutex_unlock(&sc->mu);
}

/* ---------------------------------------------------------------- routes */

static char *get_route(void *ctx, const char *path, size_t *len)
{
    struct serve_cluster *sc = ctx;
    if (strcmp(path, "/v1/cluster")) return NULL;
    return control_json(atomic_load(&sc->ctl), len);
}

static int member_api(void *ctx, uint64_t node, char *addr, size_t cap)
{
    struct serve_cluster *sc = ctx;
    return control_member_http(atomic_load(&sc->ctl), node, addr, cap);
}

/* POST /v1/cluster/recover {"voters":[ids],"force":bool} (docs/control.md). It changes raft's
 * configuration, so it is never open: the API key where the node has one, else a request signed
 * with the cluster key (`strata cluster recover`), else 403 with the reason. */
static int post_route(void *ctx, const struct http_request *req, const char *body, size_t len,
                      int key_ok, char **out, size_t *out_len, struct api_error *e)
{
    struct serve_cluster *sc = ctx;
    struct recover_req rq;
    char msg[ERRMSG_LEN];
    const char *path = req->path;
    if (strcmp(path, "/v1/cluster/recover")) return 1;
    if (!key_ok) {
        if (!req->signature[0]) {
            api_error_set(e, 403, "invalid_request_error", NULL,
                          "POST %s changes the cluster: this node has no API key, so the request "
                          "must be signed with the cluster key (X-Strata-Signature; `strata "
                          "cluster recover --key-file K --voters ...` signs it)",
                          path);
            e->code = "signature_required";
            return -1;
        }
        if (req->signature_truncated ||
            control_check_signed(atomic_load(&sc->ctl), req->method, path, req->signature,
                                 strlen(req->signature), body, len, msg)) {
            api_error_set(e, 403, "invalid_request_error", NULL, "POST %s: %s", path,
                          req->signature_truncated ? "signature: header too long" : msg);
            e->code = "bad_signature";
            return -1;
        }
    }
    if (recover_req_parse(&rq, body, len, msg))
        return api_error_set(e, 400, "invalid_request_error", "voters", "%s", msg);
    int status = control_recover(atomic_load(&sc->ctl), &rq, msg, sizeof msg);
    if (status) {
        api_error_set(e, status, status < 500 ? "invalid_request_error" : "server_error", NULL,
                      "%s", msg);
        e->code = status == 409 ? "recovery_refused" : status < 500 ? "bad_voters" : NULL;
        return -1;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "recovered");
    cJSON_AddNumberToObject(o, "node_id", (double)control_id(atomic_load(&sc->ctl)));
    cJSON *v = cJSON_AddArrayToObject(o, "voters");
    for (int i = 0; i < rq.n_voters; i++)
        cJSON_AddItemToArray(v, cJSON_CreateNumber((double)rq.voters[i]));
    cJSON_AddBoolToObject(o, "forced", rq.force);
    cJSON_AddStringToObject(o, "message", msg);
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    *out_len = *out ? strlen(*out) : 0;
    return 0;
}

static int lost_route(void *ctx, const char *model, char *why, size_t cap)
{
    struct serve_cluster *sc = ctx;
    struct control *ctl = atomic_load(&sc->ctl);
    return ctl && control_model_lost(ctl, model, why, cap);
}

static void routed(void *ctx, uint64_t node, int delta)
{
    struct serve_cluster *sc = ctx;
    control_routed(atomic_load(&sc->ctl), node, delta);
}

static void unreachable(void *ctx, uint64_t node)
{
    struct serve_cluster *sc = ctx;
    control_unreachable(atomic_load(&sc->ctl), node);
}

static int route(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                 uint64_t *node, char *err)
{
    struct serve_cluster *sc = ctx;
    return control_route(atomic_load(&sc->ctl), model, prompt_tokens, addr, cap, node, err);
}

static int forward_open(void *ctx, uint64_t node, int timeout_ms, int cancel_fd, char *err)
{
    struct serve_cluster *sc = ctx;
    return control_forward_open(atomic_load(&sc->ctl), node, timeout_ms, cancel_fd, err);
}

/* Control thread: a member's forward channel becomes a connection of our front. */
static void forward_in(void *ctx, int fd, uint64_t from)
{
    struct serve_cluster *sc = ctx;
    front_adopt(sc->front, fd, from);
}

static char *metrics(void *ctx, size_t *len)
{
    struct serve_cluster *sc = ctx;
    return control_metrics(atomic_load(&sc->ctl), len);
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
    atomic_store(&sc->sched, s);
    atomic_store(&sc->max_step_tokens, max_step_tokens);
    pthread_mutex_init(&sc->mu, NULL);
    pthread_cond_init(&sc->cv, NULL);
    snprintf(sc->model, sizeof sc->model, "%s", cfg->model ? cfg->model : "");
    sc->n_layers = cfg->n_layers;
    sc->bytes = cfg->model_bytes;
    sc->link_cap = cfg->link_cap_Bps;
    sc->fake = cfg->standby;
    snprintf(sc->test_refuse, sizeof sc->test_refuse, "%s",
             cfg->test_refuse ? cfg->test_refuse : "");
    sc->host = sc->model[0] != 0;
    sc->engine = sc->model[0] && !cfg->standby;
    sc->k = sc->engine ? sc->n_layers : 0;
    sc->front = f;
    struct control_serving sv = {.ctx = sc, .load = load, .forward_in = forward_in};
    struct cluster_exec ex = {.ctx = sc,
                              .scale_up = do_scale_up,
                              .scale_down = do_scale_down,
                              .replicate = do_replicate,
                              .drop_host = do_drop_host};
    struct control *ctl = control_start(cfg, &sv, &ex, err);
    if (!ctl) {
        pthread_mutex_destroy(&sc->mu);
        pthread_cond_destroy(&sc->cv);
        free(sc);
        return NULL;
    }
    atomic_store(&sc->ctl, ctl);
    struct front_ext fx = {.ctx = sc,
                           .get = get_route,
                           .metrics = metrics,
                           .route = route,
                           .routed = routed,
                           .unreachable = unreachable,
                           .forward_open = forward_open,
                           .post = post_route,
                           .lost = lost_route,
                           .member_api = member_api,
                           .node_id = cfg->id};
    front_set_ext(f, &fx);
    return sc;
}

void serve_cluster_stop(struct serve_cluster *sc)
{
    if (!sc) return;
    control_stop(atomic_load(&sc->ctl));
    pthread_mutex_destroy(&sc->mu);
    pthread_cond_destroy(&sc->cv);
    free(sc);
}
