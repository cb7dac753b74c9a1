#include "serving/api/serve_front.h"

#include "os/common/errmsg.h"
#include "os/runtime/pid1.h"
#include "serving/api/api_request.h"
#include "serving/api/api_response.h"
#include "serving/api/relay.h"
#include "serving/api/tokenize_api.h"
#include "serving/api/ui_page.h"
#include "os/runtime/log.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The front's side of one completion request: served here (r) or relayed (relay). */
struct front_req {
    struct front *f;
    struct http_conn *conn;
    struct sreq *r;
    /* relayed: the relay, and what serving it here after all (a held request whose route came
     * to name this node) needs */
    struct relay *relay;
    struct front_req *relay_prev, *relay_next; /* f->relays */
    struct http_request req;
    char *body;
    size_t body_len;
    uint64_t node; /* where it went (0: not yet) */
    int status;    /* the upstream's head */
    char content_type[128], extra_headers[192];
    int event_stream;
    char model[128]; /* served here: the model's name (the front may go unready mid-request) */
    char id[40];
    long long created;
    int chat, stream, include_usage, first_sent;
    int tokenize; /* relayed /tokenize (1) or /detokenize (2), not a completion */
    int probe;    /* a member's /metrics for the operator's page: no routing, no forward counts */
    int began;    /* stream headers sent (at the first token, so a rejection can still be a 503) */
    int no_replica;         /* taken while no replica existed (counted while it waits/runs) */
    long no_replica_tokens; /* its prompt tokens */
    size_t sent;            /* bytes of r->text already sent (streaming) */
};

struct front {
    struct front_config cfg;
    struct serve_metrics *m;
    struct http_server *http;
    _Atomic(const struct front_model *) model;
    struct front_model model_copy;
    _Atomic(struct scheduler *) sched;
    _Atomic(const struct front_ext *) ext;
    struct front_ext ext_copy;
    pthread_mutex_t mu;   /* progress text, the notification list and held_model */
    char held_model[128]; /* the model of the latest request held for lack of a replica */
    char stage[64];
    double progress;
    const struct layer_progress *layers; /* NULL: not reported */
    struct sreq *notify_head;
    atomic_uint wake_passes; /* on_wake calls: the front thread passed between two handlers */
    unsigned long long next_id;
    long long started;
    /* Front thread only: relayed requests in flight, and the forwarding counters. */
    struct front_req *relays;
    struct fwd_count {
        uint64_t node; /* 0: held requests that found no replica */
        unsigned long long forwarded, failed;
    } fwd[32];
    int n_fwd;
    unsigned long long forwarded_in; /* completions other nodes relayed to us */
    struct relay_pool *pool;         /* channels to other nodes kept between requests */
};

struct front *front_new(const struct front_config *cfg, struct serve_metrics *m, char *err)
{
    struct front *f = calloc(1, sizeof *f);
    if (!f) {
        errmsg_set(err, "front: out of memory");
        return NULL;
    }
    f->cfg = *cfg;
    if (f->cfg.default_max_tokens_completion <= 0) f->cfg.default_max_tokens_completion = 16;
    if (f->cfg.forward_connect_ms <= 0) f->cfg.forward_connect_ms = 3000;
    if (f->cfg.forward_idle_ms <= 0) f->cfg.forward_idle_ms = 120000;
    if (f->cfg.forward_hold_ms <= 0) f->cfg.forward_hold_ms = 20000;
    if (!(f->pool = relay_pool_new(f->cfg.forward_pool, f->cfg.forward_pool_idle_ms))) {
        free(f);
        errmsg_set(err, "front: out of memory");
        return NULL;
    }
    f->m = m;
    pthread_mutex_init(&f->mu, NULL);
    snprintf(f->stage, sizeof f->stage, "starting");
    f->started = (long long)time(NULL);
    return f;
}

void front_free(struct front *f)
{
    if (!f) return;
    struct sreq *r = f->notify_head;
    while (r) {
        struct sreq *n = r->notify_next;
        sreq_put(r);
        r = n;
    }
    relay_pool_free(f->pool);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void front_set_progress(struct front *f, const char *stage, double fraction)
{
    pthread_mutex_lock(&f->mu);
    snprintf(f->stage, sizeof f->stage, "%s", stage);
    f->progress = fraction;
    pthread_mutex_unlock(&f->mu);
}

void front_set_server(struct front *f, struct http_server *s)
{
    f->http = s;
}

void front_set_layers(struct front *f, const struct layer_progress *lp)
{
    f->layers = lp;
}

void front_set_ready(struct front *f, const struct front_model *model, struct scheduler *s)
{
    f->model_copy = *model;
    atomic_store(&f->sched, s);
    atomic_store(&f->model, &f->model_copy);
    front_set_progress(f, "ready", 1.0);
}

void front_set_unready(struct front *f, const char *stage)
{
    atomic_store(&f->model, NULL);
    atomic_store(&f->sched, NULL);
    front_set_progress(f, stage, 0);
    /* A handler that loaded the old pointers runs on the front thread, which calls on_wake only
     * between handlers: once it has, nobody holds them. */
    unsigned before = atomic_load(&f->wake_passes);
    for (int i = 0; i < 2000 && atomic_load(&f->wake_passes) == before; i++) {
        if (f->http) http_server_wake(f->http);
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void front_set_ext(struct front *f, const struct front_ext *ext)
{
    f->ext_copy = *ext;
    atomic_store(&f->ext, &f->ext_copy);
}

/* ---------------------------------------------------------------- responses */

static void send_json(struct front *f, struct http_conn *c, int status, char *body,
                      const char *extra)
{
    (void)f;
    http_respond(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2, extra);
    free(body);
}

static void send_error(struct front *f, struct http_conn *c, const struct api_error *e)
{
    if (e->status == 503)
        metrics_request(f->m, OUTCOME_REJECTED);
    else if (e->status >= 500)
        metrics_request(f->m, OUTCOME_ERROR);
    else
        metrics_request(f->m, OUTCOME_INVALID);
    const char *extra = NULL;
    if (e->status == 503) extra = "Retry-After: 1\r\n";
    if (e->status == 401) extra = "WWW-Authenticate: Bearer\r\n";
    send_json(f, c, e->status, api_error_json(e), extra);
}

static void handle_health(struct front *f, struct http_conn *c)
{
    const struct front_model *model = atomic_load(&f->model);
    cJSON *o = cJSON_CreateObject();
    pthread_mutex_lock(&f->mu);
    cJSON_AddStringToObject(o, "status", model ? "ok" : "loading");
    cJSON_AddStringToObject(o, "stage", f->stage);
    cJSON_AddNumberToObject(o, "progress", f->progress);
    pthread_mutex_unlock(&f->mu);
    if (model) cJSON_AddStringToObject(o, "model", model->name);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "processes", pid1_process_count());
    cJSON_AddNumberToObject(o, "running", atomic_load(&f->m->running));
    cJSON_AddNumberToObject(o, "waiting", atomic_load(&f->m->waiting));
    if (f->layers) layer_progress_json(f->layers, o);
    const struct front_ext *ext = atomic_load(&f->ext);
    char why[ERRMSG_LEN];
    if (ext && ext->lost && ext->lost(ext->ctx, "", why, sizeof why))
        cJSON_AddStringToObject(o, "model_lost", why);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    send_json(f, c, model ? 200 : 503, body, model ? NULL : "Retry-After: 1\r\n");
}

/* strata_forwarded_requests_total{to}, strata_forward_failures_total{to} (to="none": held
 * without a replica until the hold ran out), strata_forwarded_received_total, and the channels
 * the relays used: opened fresh (and their open time), reused from the pool, found closed. */
static char *forward_metrics(struct front *f, size_t *len)
{
    size_t cap = 1536 + (size_t)f->n_fwd * 160;
    char *t = malloc(cap);
    if (!t) return NULL;
    size_t n = 0;
    n += (size_t)snprintf(t + n, cap - n, "# TYPE strata_forwarded_requests_total counter\n");
    for (int i = 0; i < f->n_fwd; i++)
        if (f->fwd[i].node)
            n += (size_t)snprintf(t + n, cap - n,
                                  "strata_forwarded_requests_total{to=\"%llu\"} %llu\n",
                                  (unsigned long long)f->fwd[i].node, f->fwd[i].forwarded);
    n += (size_t)snprintf(t + n, cap - n, "# TYPE strata_forward_failures_total counter\n");
    for (int i = 0; i < f->n_fwd; i++) {
        char to[24] = "none";
        if (f->fwd[i].node) snprintf(to, sizeof to, "%llu", (unsigned long long)f->fwd[i].node);
        n += (size_t)snprintf(t + n, cap - n, "strata_forward_failures_total{to=\"%s\"} %llu\n", to,
                              f->fwd[i].failed);
    }
    n += (size_t)snprintf(t + n, cap - n,
                          "# TYPE strata_forwarded_received_total counter\n"
                          "strata_forwarded_received_total %llu\n",
                          f->forwarded_in);
    struct relay_pool_stats ps;
    relay_pool_stats(f->pool, &ps);
    n += (size_t)snprintf(t + n, cap - n,
                          "# TYPE strata_forward_channels_opened_total counter\n"
                          "strata_forward_channels_opened_total %llu\n"
                          "# TYPE strata_forward_channel_open_seconds_total counter\n"
                          "strata_forward_channel_open_seconds_total %.6f\n"
                          "# TYPE strata_forward_channels_reused_total counter\n"
                          "strata_forward_channels_reused_total %llu\n"
                          "# TYPE strata_forward_channels_stale_total counter\n"
                          "strata_forward_channels_stale_total %llu\n"
                          "# TYPE strata_forward_channels_idle gauge\n"
                          "strata_forward_channels_idle %d\n",
                          ps.opened, ps.open_us / 1e6, ps.reused, ps.stale, ps.idle);
    *len = n;
    return t;
}

static void handle_metrics(struct front *f, struct http_conn *c)
{
    size_t len = 0;
    char *text = metrics_render(f->m, &len);
    size_t llen = 0;
    char *ltext = f->layers && text ? layer_progress_prom(f->layers, &llen) : NULL;
    if (ltext) {
        char *both = realloc(text, len + llen + 1);
        if (both) {
            memcpy(both + len, ltext, llen + 1);
            text = both;
            len += llen;
        }
        free(ltext);
    }
    char *ftext = text ? forward_metrics(f, &llen) : NULL;
    if (ftext) {
        char *both = realloc(text, len + llen + 1);
        if (both) {
            memcpy(both + len, ftext, llen + 1);
            text = both;
            len += llen;
        }
        free(ftext);
    }
    const struct front_ext *ext = atomic_load(&f->ext);
    size_t xlen = 0;
    char *extra = ext && ext->metrics && text ? ext->metrics(ext->ctx, &xlen) : NULL;
    char *both = extra ? realloc(text, len + xlen + 1) : NULL;
    if (both) {
        memcpy(both + len, extra, xlen);
        both[len + xlen] = 0;
        text = both;
        len += xlen;
    }
    free(extra);
    http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text ? text : "", len, NULL);
    free(text);
}

static void handle_models(struct front *f, struct http_conn *c, const struct front_model *m)
{
    send_json(f, c, 200, api_models_json(m->name, f->started), NULL);
}

/* ---------------------------------------------------------------- completions */

static int sse(struct http_conn *c, const char *json)
{
    size_t n = strlen(json);
    char *buf = malloc(n + 9);
    if (!buf) return -1;
    memcpy(buf, "data: ", 6);
    memcpy(buf + 6, json, n);
    memcpy(buf + 6 + n, "\n\n", 2);
    int rc = http_stream_write(c, buf, n + 8);
    free(buf);
    return rc;
}

static const char *finish_name(int finish)
{
    return finish == FINISH_LENGTH ? "length" : "stop";
}

/* A held request that no longer waits for a replica: out of serve_metrics' no_replica counts. */
static void no_replica_done(struct front_req *fr)
{
    if (!fr->no_replica) return;
    atomic_fetch_sub(&fr->f->m->no_replica, 1);
    atomic_fetch_sub(&fr->f->m->no_replica_tokens, fr->no_replica_tokens);
    fr->no_replica = 0;
}

static void front_req_free(struct front_req *fr)
{
    no_replica_done(fr);
    /* The connection may already carry the next (pipelined) request: clear only our own. */
    if (fr->conn && http_conn_user(fr->conn) == fr) http_conn_set_user(fr->conn, NULL);
    if (fr->r) {
        fr->r->user = NULL;
        sreq_put(fr->r);
    }
    if (fr->relay) {
        relay_cancel(fr->relay); /* closes the upstream connection: cancelled there too */
        struct front *f = fr->f;
        const struct front_ext *ext = atomic_load(&f->ext);
        if (fr->node && !fr->probe && ext && ext->routed) ext->routed(ext->ctx, fr->node, -1);
        if (fr->relay_prev)
            fr->relay_prev->relay_next = fr->relay_next;
        else
            f->relays = fr->relay_next;
        if (fr->relay_next) fr->relay_next->relay_prev = fr->relay_prev;
    }
    free(fr->body);
    free(fr);
}

/* Send what the scheduler produced for fr since last time. */
/* A request that failed: its error as the JSON answer, or, once the headers are out, inside the
 * stream (an error event and [DONE] when the stream carries server-sent events) and the end. */
static void send_failure(struct front *f, struct http_conn *c, int began, int events,
                         struct api_error *e)
{
    if (!began) {
        send_json(f, c, e->status, api_error_json(e),
                  e->status == 503 ? "Retry-After: 1\r\n" : NULL);
        return;
    }
    if (events) {
        char *j = api_error_json(e);
        if (j) sse(c, j);
        free(j);
        sse(c, "[DONE]");
    }
    http_stream_end(c);
}

static void deliver(struct front *f, struct front_req *fr)
{
    struct sreq *r = fr->r;
    struct sreq_output out;
    if (sreq_output(r, &out)) return;
    int finish = out.finish, n_gen = out.n_generated;
    size_t len = out.text_len;
    char *text = out.text;
    const char *error = out.error;
    struct api_reply rep = {.chat = fr->chat,
                            .id = fr->id,
                            .created = fr->created,
                            .model = fr->model,
                            .finish_reason = NULL,
                            .prompt_tokens = r->n_prompt,
                            .completion_tokens = n_gen,
                            .cached_tokens = out.n_cached};
    struct http_conn *c = fr->conn;
    if (finish == FINISH_ERROR || finish == FINISH_CANCELLED || finish == FINISH_REJECTED) {
        struct api_error e;
        api_error_set(&e, 500, "server_error", NULL, "%s",
                      error[0] ? error : "the request was cancelled");
        if (strstr(error, "shutting down") || finish == FINISH_REJECTED) e.status = 503;
        if (finish == FINISH_REJECTED && strstr(error, " is lost: ")) e.code = "model_lost";
        send_failure(f, c, fr->began, 1, &e);
        free(text);
        front_req_free(fr);
        return;
    }
    if (fr->stream) {
        if (!fr->began) {
            http_stream_begin(c, 200, "text/event-stream");
            fr->began = 1;
        }
        if (len > fr->sent || (fr->chat && !fr->first_sent)) {
            char *j = api_chunk_json(&rep, text + fr->sent, len - fr->sent, !fr->first_sent);
            fr->first_sent = 1;
            fr->sent = len;
            if (j) sse(c, j);
            free(j);
        }
        if (finish) {
            rep.finish_reason = finish_name(finish);
            char *j = api_chunk_json(&rep, "", 0, 0);
            if (j) sse(c, j);
            free(j);
            if (fr->include_usage) {
                j = api_usage_chunk_json(&rep);
                if (j) sse(c, j);
                free(j);
            }
            sse(c, "[DONE]");
            http_stream_end(c);
            front_req_free(fr);
        }
    } else if (finish) {
        rep.finish_reason = finish_name(finish);
        send_json(f, c, 200, api_completion_json(&rep, text, len), NULL);
        front_req_free(fr);
    }
    free(text);
}

static int check_auth(struct front *f, const struct http_request *req, struct api_error *e)
{
    const char *key = f->cfg.api_key;
    if (!key || !key[0]) return 0;
    if (!req->has_auth || !req->bearer[0])
        return api_error_set(e, 401, "invalid_request_error", NULL,
                             "You didn't provide an API key. You need to provide your API key in "
                             "an Authorization header using Bearer auth (i.e. Authorization: "
                             "Bearer YOUR_KEY).");
    /* constant time in the key's length */
    size_t kl = strlen(key), bl = strlen(req->bearer);
    unsigned diff = (unsigned)(kl != bl) | (unsigned)req->bearer_truncated;
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < bl ? req->bearer[i] : 0);
    if (diff)
        return api_error_set(e, 401, "invalid_request_error", NULL, "Incorrect API key provided.");
    return 0;
}

static int tokenize(const struct front_model *m, const struct completion_request *cr, int **ids,
                    int *n, struct api_error *e)
{
    if (cr->prompt_ids) {
        for (int i = 0; i < cr->n_prompt_ids; i++)
            if (cr->prompt_ids[i] >= m->vocab_size)
                return api_error_set(e, 400, "invalid_request_error", "prompt",
                                     "Invalid value for 'prompt': token id %d at index %d is "
                                     "outside the vocabulary (%d tokens).",
                                     cr->prompt_ids[i], i, m->vocab_size);
        *ids = malloc((size_t)cr->n_prompt_ids * sizeof **ids);
        if (!*ids) return api_error_set(e, 500, "server_error", NULL, "out of memory");
        memcpy(*ids, cr->prompt_ids, (size_t)cr->n_prompt_ids * sizeof **ids);
        *n = cr->n_prompt_ids;
        return 0;
    }
    struct chat_rendered rendered = {0};
    const char *text = cr->prompt;
    if (cr->chat) {
        if (chat_template_render_spans(m->tmpl, cr->messages, cr->n_messages, 1, &rendered))
            return api_error_set(e, 500, "server_error", NULL, "out of memory");
        text = rendered.text;
    }
    size_t len = strlen(text);
    /* Every byte can become at most one token (byte fallback), plus BOS; with special tokens
     * cut out of a chat prompt, plus a dummy-prefix space after each. */
    size_t lim = len < (size_t)(1 << 27) ? len : (1 << 27);
    int cap = (int)(cr->chat ? 2 * lim + 3 : lim + 2);
    *ids = malloc((size_t)cap * sizeof **ids);
    char err[ERRMSG_LEN] = "tokenizer failed";
    int rc = -1;
    if (*ids && cr->chat && m->encode_chat)
        rc = m->encode_chat(m->tok, &rendered, *ids, cap, n, err);
    else if (*ids)
        rc = m->encode(m->tok, text, len, *ids, cap, n, err);
    chat_rendered_free(&rendered);
    if (rc) {
        free(*ids);
        *ids = NULL;
        return api_error_set(e, 500, "server_error", NULL, "%s", err);
    }
    return 0;
}

/* ---------------------------------------------------------------- routing and relaying */

static struct fwd_count *fwd_count(struct front *f, uint64_t node)
{
    for (int i = 0; i < f->n_fwd; i++)
        if (f->fwd[i].node == node) return &f->fwd[i];
    if (f->n_fwd == (int)(sizeof f->fwd / sizeof f->fwd[0])) return NULL;
    f->fwd[f->n_fwd] = (struct fwd_count){.node = node};
    return &f->fwd[f->n_fwd++];
}

/* A held request's model lost (relay threads). */
static int front_lost(void *ctx, const char *model, char *why, size_t cap)
{
    struct front *f = ctx;
    const struct front_ext *ext = atomic_load(&f->ext);
    return ext && ext->lost && ext->lost(ext->ctx, model, why, cap);
}

/* Where a completion goes (enum relay_route). Front thread and relay threads: reads only atomics
 * and the thread-safe ext->route. With the model loaded here, whatever is not another node is
 * served here ("none": this node's queue is the demand the planner sees). */
static int front_route(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                       uint64_t *node)
{
    struct front *f = ctx;
    const struct front_ext *ext = atomic_load(&f->ext);
    int here = atomic_load(&f->model) && atomic_load(&f->sched);
    char err[ERRMSG_LEN];
    *node = 0;
    if (!ext || !ext->route) return here ? RELAY_ROUTE_LOCAL : RELAY_ROUTE_NONE;
    if (ext->route(ext->ctx, model, prompt_tokens, addr, cap, node, err)) {
        log_warn("route", "%s", err);
        return here ? RELAY_ROUTE_LOCAL : RELAY_ROUTE_NONE;
    }
    if (strcmp(addr, "local") && strcmp(addr, "none") && addr[0]) return RELAY_ROUTE_REMOTE;
    return here ? RELAY_ROUTE_LOCAL : RELAY_ROUTE_NONE;
}

/* A channel to node for a relay: the cluster's sealed forward channel (relay threads). */
static int front_open_channel(void *ctx, uint64_t node, int timeout_ms, int cancel_fd, char *err)
{
    struct front *f = ctx;
    const struct front_ext *ext = atomic_load(&f->ext);
    if (!ext || !ext->forward_open) return errmsg_set(err, "no forward channels here");
    return ext->forward_open(ext->ctx, node, timeout_ms, cancel_fd, err);
}

void front_held_model(struct front *f, char *out, size_t cap)
{
    pthread_mutex_lock(&f->mu);
    snprintf(out, cap, "%s", f->held_model);
    pthread_mutex_unlock(&f->mu);
}

int front_adopt(struct front *f, int fd, uint64_t from_node)
{
    if (!f->http) {
        close(fd);
        return -1;
    }
    return http_server_adopt(f->http, fd, from_node);
}

static void front_unreachable(void *ctx, uint64_t node)
{
    struct front *f = ctx;
    const struct front_ext *ext = atomic_load(&f->ext);
    log_warn("route", "node %llu cannot be reached: asking the route again",
             (unsigned long long)node);
    if (ext && ext->unreachable) ext->unreachable(ext->ctx, node);
}

/* A request that names no token ids is routed before a tokenizer saw it (this node may have
 * none): about four bytes a token, the planner's prediction needs no more. */
static int estimate_tokens(const struct completion_request *cr)
{
    if (cr->prompt_ids) return cr->n_prompt_ids;
    size_t bytes = cr->prompt ? strlen(cr->prompt) : 0;
    for (int i = 0; i < cr->n_messages; i++)
        bytes += cr->messages[i].content ? strlen(cr->messages[i].content) + 8 : 8;
    return (int)(bytes / 4 + 1);
}

/* Relay the request to addr (node), or hold it (addr NULL) until the route names a node. */
static void forward(struct front *f, struct http_conn *c, const struct http_request *req,
                    const char *body, size_t len, int chat, int tokenize, const char *model,
                    int prompt_tokens, const char *addr, uint64_t node)
{
    const struct front_ext *ext = atomic_load(&f->ext);
    struct api_error e;
    char err[ERRMSG_LEN];
    struct front_req *fr = calloc(1, sizeof *fr);
    if (fr) fr->body = malloc(len + 1);
    if (!fr || !fr->body) {
        if (fr) free(fr);
        api_error_set(&e, 500, "server_error", NULL, "out of memory");
        send_error(f, c, &e);
        return;
    }
    memcpy(fr->body, body, len);
    fr->body_len = len;
    fr->req = *req;
    fr->f = f;
    fr->conn = c;
    fr->chat = chat;
    fr->tokenize = tokenize;
    struct relay_config rc = {.target = addr,
                              .target_node = node,
                              .path = req->path,
                              .body = body,
                              .body_len = len,
                              .bearer = req->has_auth ? req->bearer : NULL,
                              .self = ext ? ext->node_id : 0,
                              .model = model,
                              .prompt_tokens = prompt_tokens,
                              .connect_timeout_ms = f->cfg.forward_connect_ms,
                              .idle_timeout_ms = f->cfg.forward_idle_ms,
                              .deadline_ms = f->cfg.forward_deadline_ms,
                              .hold_ms = f->cfg.forward_hold_ms,
                              .route = front_route,
                              .route_ctx = f,
                              .lost = ext && ext->lost ? front_lost : NULL,
                              .unreachable = front_unreachable,
                              .wake = front_wake,
                              .wake_ctx = f,
                              .open_channel = ext && ext->forward_open ? front_open_channel : NULL,
                              .channel_ctx = f,
                              .pool = f->pool};
    if (!(fr->relay = relay_start(&rc, err))) {
        free(fr->body);
        free(fr);
        api_error_set(&e, 500, "server_error", NULL, "%s", err);
        send_error(f, c, &e);
        return;
    }
    fr->relay_next = f->relays;
    if (f->relays) f->relays->relay_prev = fr;
    f->relays = fr;
    http_conn_set_user(c, fr);
    if (addr) {
        fr->node = node;
        struct fwd_count *k = fwd_count(f, node);
        if (k) k->forwarded++;
        if (ext && ext->routed) ext->routed(ext->ctx, node, +1);
    }
    if (addr)
        log_info("route", "%s (about %d prompt tokens): forwarded to node %llu at %s", req->path,
                 prompt_tokens, (unsigned long long)node, addr);
    else {
        log_info("route", "%s: no replica of %s yet: held for up to %d ms", req->path,
                 model[0] ? model : "the model", f->cfg.forward_hold_ms);
        /* It waits for a replica: demand the planner counts as held (a cold start). */
        fr->no_replica = 1;
        fr->no_replica_tokens = prompt_tokens;
        atomic_fetch_add(&f->m->no_replica, 1);
        atomic_fetch_add(&f->m->no_replica_tokens, prompt_tokens);
        pthread_mutex_lock(&f->mu);
        snprintf(f->held_model, sizeof f->held_model, "%s", model);
        pthread_mutex_unlock(&f->mu);
    }
}

static void handle_completion(struct front *f, struct http_conn *c, const struct http_request *req,
                              const char *body, size_t len, int chat, int may_route);
static void handle_tokenize(struct front *f, struct http_conn *c, const struct http_request *req,
                            const char *body, size_t len, int detokenize, int may_route);

/* What a relay queued since last time, written to its client. */
static void relay_deliver(struct front *f, struct front_req *fr)
{
    struct relay_out o;
    if (!relay_take(fr->relay, &o)) return;
    if (o.node || o.local || o.failed || o.done) no_replica_done(fr); /* it waits no more */
    struct http_conn *c = fr->conn;
    if (o.node && !fr->node) {
        fr->node = o.node;
        struct fwd_count *k = fwd_count(f, o.node);
        if (k) k->forwarded++;
    }
    if (o.local) {
        /* Held, and this node can serve it now. */
        log_info("route", "%s: held request served here", fr->req.path);
        struct http_request req = fr->req;
        char *body = fr->body;
        size_t len = fr->body_len;
        int chat = fr->chat, tokenize = fr->tokenize;
        fr->body = NULL;
        front_req_free(fr);
        if (tokenize)
            handle_tokenize(f, c, &req, body, len, tokenize == 2, 0);
        else
            handle_completion(f, c, &req, body, len, chat, 0);
        free(body);
        return;
    }
    if (o.head) {
        fr->status = o.status;
        snprintf(fr->content_type, sizeof fr->content_type, "%s", o.content_type);
        snprintf(fr->extra_headers, sizeof fr->extra_headers, "%s", o.extra_headers);
        fr->event_stream = !strncmp(o.content_type, "text/event-stream", 17);
        if (o.streamed) {
            http_stream_begin(c, o.status, o.content_type);
            fr->began = 1;
        }
    }
    if (o.data && fr->began) http_stream_write(c, o.data, o.len);
    if (o.failed) {
        struct fwd_count *k = fr->probe ? NULL : fwd_count(f, fr->node);
        if (k) k->failed++;
        log_warn("route", "%s", o.error);
        struct api_error e;
        api_error_set(&e, o.fail_status, "server_error", NULL, "%s", o.error);
        e.code = o.lost ? "model_lost" : o.fail_status == 503 ? "no_replica" : "upstream_failed";
        send_failure(f, c, fr->began, fr->event_stream, &e); /* after the last whole event */
        front_req_free(fr);
    } else if (o.done) {
        if (fr->began)
            http_stream_end(c);
        else
            http_respond(c, fr->status, fr->content_type, o.data ? o.data : "", o.len,
                         fr->extra_headers[0] ? fr->extra_headers : NULL);
        front_req_free(fr);
    }
    free(o.data);
}

/* ---------------------------------------------------------------- completions (here) */

static void handle_completion(struct front *f, struct http_conn *c, const struct http_request *req,
                              const char *body, size_t len, int chat, int may_route)
{
    struct api_error e;
    const struct front_model *m = atomic_load(&f->model);
    struct scheduler *s = atomic_load(&f->sched);
    const struct front_ext *ext = atomic_load(&f->ext);
    int route = may_route && !req->forwarded && !req->route_local && ext && ext->route;
    if ((!m || !s) && !route) {
        if (req->route_local)
            api_error_set(&e, 503, "server_error", NULL,
                          "X-Strata-Route: local: this node has no model to serve it with "
                          "(see /health).");
        else
            api_error_set(&e, 503, "server_error", NULL,
                          "The model is still loading; retry shortly (see /health).");
        send_error(f, c, &e);
        return;
    }
    struct completion_request cr;
    if (api_request_parse(body, len, chat, &cr, &e)) {
        send_error(f, c, &e);
        return;
    }
    if (req->route_local && cr.model[0] && strcmp(cr.model, m->name)) {
        api_error_set(&e, 404, "invalid_request_error", "model",
                      "X-Strata-Route: local: this node serves '%s', not '%s'.", m->name, cr.model);
        e.code = "model_not_found";
        api_request_free(&cr);
        send_error(f, c, &e);
        return;
    }
    /* A model the cluster lost (no live node holds some of its layers) fails at once: neither
     * held for a replica that cannot come, nor queued here for a helper that is gone. */
    char why[ERRMSG_LEN];
    if (ext && ext->lost && ext->lost(ext->ctx, cr.model, why, sizeof why)) {
        api_error_set(&e, 503, "server_error", NULL, "%s", why);
        e.code = "model_lost";
        api_request_free(&cr);
        send_error(f, c, &e);
        return;
    }
    char addr[RELAY_ADDR_LEN] = "";
    uint64_t node = 0;
    if (!m || !s) {
        /* Nothing here to serve it with: another node, or held until there is one. */
        int est = estimate_tokens(&cr);
        int rt = front_route(f, cr.model, est, addr, sizeof addr, &node);
        forward(f, c, req, body, len, chat, 0, cr.model, est,
                rt == RELAY_ROUTE_REMOTE ? addr : NULL, node);
        api_request_free(&cr);
        return;
    }
    int *ids = NULL, n = 0;
    if (tokenize(m, &cr, &ids, &n, &e)) goto fail;
    if (n >= m->ctx) {
        api_error_set(&e, 400, "invalid_request_error", chat ? "messages" : "prompt",
                      "This model's maximum context length is %d tokens. However, your prompt "
                      "has %d tokens. Please reduce the length of the prompt.",
                      m->ctx, n);
        e.code = "context_length_exceeded";
        goto fail;
    }
    int max_tokens = cr.max_tokens;
    if (max_tokens < 0) {
        max_tokens = m->ctx - n;
        if (!chat && max_tokens > f->cfg.default_max_tokens_completion)
            max_tokens = f->cfg.default_max_tokens_completion;
    } else if ((long long)n + max_tokens > m->ctx) {
        api_error_set(&e, 400, "invalid_request_error", "max_tokens",
                      "This model's maximum context length is %d tokens. However, you requested "
                      "%lld tokens (%d in the prompt, %d for the completion). Please reduce the "
                      "length of the prompt or completion.",
                      m->ctx, (long long)n + max_tokens, n, max_tokens);
        e.code = "context_length_exceeded";
        goto fail;
    }
    if (cr.min_tokens > max_tokens) {
        api_error_set(&e, 400, "invalid_request_error", "min_tokens",
                      "Invalid value for 'min_tokens': %d exceeds max_tokens (%d).", cr.min_tokens,
                      max_tokens);
        goto fail;
    }
    int rt = route ? front_route(f, cr.model, n, addr, sizeof addr, &node) : RELAY_ROUTE_LOCAL;
    if (rt == RELAY_ROUTE_REMOTE) {
        free(ids);
        forward(f, c, req, body, len, chat, 0, cr.model, n, addr, node);
        api_request_free(&cr);
        return;
    }
    struct sreq *r = sreq_new();
    struct front_req *fr = calloc(1, sizeof *fr);
    if (!r || !fr) {
        free(fr);
        if (r) sreq_put(r);
        api_error_set(&e, 500, "server_error", NULL, "out of memory");
        goto fail;
    }
    r->prompt = ids;
    r->n_prompt = n;
    ids = NULL;
    r->max_tokens = max_tokens;
    r->min_tokens = cr.min_tokens;
    r->ignore_eos = cr.ignore_eos;
    r->sp = (struct sampler_params){
        .temperature = cr.temperature,
        .top_p = cr.top_p,
        .top_k = cr.top_k,
        .min_p = cr.min_p,
        .seed = cr.has_seed ? cr.seed : (uint64_t)time(NULL) * 2654435761u + f->next_id};
    for (int i = 0; i < cr.n_stop && i < SREQ_MAX_STOP; i++) {
        r->stop[i] = cr.stop[i];
        cr.stop[i] = NULL;
        r->n_stop++;
    }
    r->ttft_ms = cr.ttft_ms;
    r->tpot_ms = cr.tpot_ms;
    fr->f = f;
    fr->conn = c;
    fr->r = r;
    snprintf(fr->model, sizeof fr->model, "%s", m->name);
    fr->chat = chat;
    fr->stream = cr.stream;
    fr->include_usage = cr.include_usage;
    fr->created = (long long)time(NULL);
    snprintf(fr->id, sizeof fr->id, "%s-%llu", chat ? "chatcmpl" : "cmpl", ++f->next_id);
    r->user = fr;
    char err[ERRMSG_LEN];
    if (sched_submit(s, r, err)) {
        api_error_set(&e, 400, "invalid_request_error", chat ? "messages" : "prompt", "%s", err);
        r->user = NULL;
        free(fr);
        sreq_put(r);
        goto fail;
    }
    if (route && !strcmp(addr, "none")) {
        /* No replica anywhere: served here from the host copy, and demand that waits for one
         * (the planner counts it as held and brings the model back: a cold start). */
        fr->no_replica = 1;
        fr->no_replica_tokens = n;
        atomic_fetch_add(&f->m->no_replica, 1);
        atomic_fetch_add(&f->m->no_replica_tokens, n);
        pthread_mutex_lock(&f->mu);
        snprintf(f->held_model, sizeof f->held_model, "%s", m->name);
        pthread_mutex_unlock(&f->mu);
    }
    api_request_free(&cr);
    http_conn_set_user(c, fr);
    return;
fail:
    free(ids);
    api_request_free(&cr);
    send_error(f, c, &e);
}

/* ---------------------------------------------------------------- /tokenize, /detokenize */

/* Served with this node's tokenizer when it has the model (and the request names no other one);
 * otherwise routed as a completion is: relayed to a node with a replica, or held until one
 * appears (503 after the hold), or 503 at once outside a cluster. */
static void handle_tokenize(struct front *f, struct http_conn *c, const struct http_request *req,
                            const char *body, size_t len, int detokenize, int may_route)
{
    struct api_error e;
    const struct front_model *m = atomic_load(&f->model);
    const struct front_ext *ext = atomic_load(&f->ext);
    int route = may_route && !req->forwarded && !req->route_local && ext && ext->route;
    if (!m && !route) {
        api_error_set(&e, 503, "server_error", NULL,
                      "The model is still loading; retry shortly (see /health).");
        send_error(f, c, &e);
        return;
    }
    struct tokenize_request r;
    if (tokenize_request_parse(detokenize, body, len, &r, &e)) {
        send_error(f, c, &e);
        return;
    }
    if (route && (!m || (r.model[0] && strcmp(r.model, m->name)))) {
        char addr[RELAY_ADDR_LEN] = "";
        uint64_t node = 0;
        int est = tokenize_request_estimate(&r);
        int rt = front_route(f, r.model, est, addr, sizeof addr, &node);
        if (rt != RELAY_ROUTE_LOCAL || !m) {
            forward(f, c, req, body, len, 0, detokenize ? 2 : 1, r.model, est,
                    rt == RELAY_ROUTE_REMOTE ? addr : NULL, node);
            tokenize_request_free(&r);
            return;
        }
    }
    char *out = NULL;
    size_t out_len = 0;
    struct token_ops ops = {m->tok, m->vocab_size, m->tokenize, m->piece};
    if (!m->tokenize || !m->piece)
        api_error_set(&e, 501, "server_error", NULL, "This model has no tokenizer to %s with.",
                      detokenize ? "detokenize" : "tokenize");
    if (!m->tokenize || !m->piece || tokenize_request_answer(&r, &ops, &out, &out_len, &e)) {
        tokenize_request_free(&r);
        send_error(f, c, &e);
        return;
    }
    tokenize_request_free(&r);
    http_respond(c, 200, "application/json", out, out_len, NULL);
    free(out);
}

/* ---------------------------------------------------------------- the operator's page */

/* GET /: the page (HTML, CSS and JS compiled into the binary). It is open like /health: it
 * holds nothing, and every fetch it makes carries the key the operator typed. The policy lets it
 * fetch from this node only. */
static void handle_page(struct front *f, struct http_conn *c)
{
    (void)f;
    size_t len = 0;
    const char *page = ui_page(&len);
    http_respond(c, 200, "text/html; charset=utf-8", page, len,
                 "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                 "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
                 "style-src 'unsafe-inline'; img-src data:; connect-src 'self'\r\n");
}

/* GET /v1/cluster/nodes/ID/metrics: member ID's /metrics for the page, which reads every member
 * through the node it was opened on: this node's own here, another's relayed through a forward
 * channel (never counted as a forwarded request, never routed elsewhere, never relayed twice). */
static void handle_node_metrics(struct front *f, struct http_conn *c,
                                const struct http_request *req)
{
    struct api_error e;
    const struct front_ext *ext = atomic_load(&f->ext);
    unsigned long long id = 0;
    int end = 0;
    char addr[RELAY_ADDR_LEN] = "", err[ERRMSG_LEN];
    if (sscanf(req->path, "/v1/cluster/nodes/%llu/metrics%n", &id, &end) != 1 || !end ||
        req->path[end] || !id) {
        api_error_set(&e, 404, "invalid_request_error", NULL, "Unknown request URL: GET %s.",
                      req->path);
        send_error(f, c, &e);
        return;
    }
    if (ext && id == ext->node_id) {
        handle_metrics(f, c);
        return;
    }
    if (!ext || !ext->member_api || ext->member_api(ext->ctx, id, addr, sizeof addr) ||
        req->forwarded) {
        api_error_set(&e, 404, "invalid_request_error", NULL, "Node %llu is no member %s.", id,
                      ext ? "of this cluster" : "(this node runs without --cluster)");
        send_error(f, c, &e);
        return;
    }
    struct front_req *fr = calloc(1, sizeof *fr);
    if (!fr) {
        api_error_set(&e, 500, "server_error", NULL, "out of memory");
        send_error(f, c, &e);
        return;
    }
    if (!addr[0]) snprintf(addr, sizeof addr, "node-%llu", id);
    fr->req = *req;
    fr->f = f;
    fr->conn = c;
    fr->probe = 1;
    fr->node = id;
    struct relay_config rc = {.target = addr,
                              .target_node = id,
                              .path = "/metrics",
                              .method = "GET",
                              .body = "",
                              .bearer = req->has_auth ? req->bearer : NULL,
                              .self = ext->node_id,
                              .model = "",
                              .connect_timeout_ms = f->cfg.forward_connect_ms,
                              .idle_timeout_ms = f->cfg.forward_connect_ms,
                              .wake = front_wake,
                              .wake_ctx = f,
                              .open_channel = ext->forward_open ? front_open_channel : NULL,
                              .channel_ctx = f,
                              .pool = f->pool};
    if (!(fr->relay = relay_start(&rc, err))) {
        free(fr);
        api_error_set(&e, 500, "server_error", NULL, "%s", err);
        send_error(f, c, &e);
        return;
    }
    fr->relay_next = f->relays;
    if (f->relays) f->relays->relay_prev = fr;
    f->relays = fr;
    http_conn_set_user(c, fr);
}

/* ---------------------------------------------------------------- handler */

static void on_request(void *ctx, struct http_conn *c, const struct http_request *req,
                       const char *body, size_t len)
{
    struct front *f = ctx;
    struct api_error e;
    const char *p = req->path;
    int get = !strcmp(req->method, "GET");
    int post = !strcmp(req->method, "POST");
    if (!strcmp(p, "/health")) {
        if (get)
            handle_health(f, c);
        else
            goto method;
        return;
    }
    if (!strcmp(p, "/metrics")) {
        if (get)
            handle_metrics(f, c);
        else
            goto method;
        return;
    }
    if (!strcmp(p, "/")) {
        if (get)
            handle_page(f, c);
        else
            goto method;
        return;
    }
    if (!strncmp(p, "/v1/cluster/nodes/", 18)) {
        if (check_auth(f, req, &e)) {
            send_error(f, c, &e);
            return;
        }
        if (!get) goto method;
        handle_node_metrics(f, c, req);
        return;
    }
    int is_models = !strcmp(p, "/v1/models"), is_cmpl = !strcmp(p, "/v1/completions"),
        is_chat = !strcmp(p, "/v1/chat/completions"), is_tok = !strcmp(p, "/tokenize"),
        is_detok = !strcmp(p, "/detokenize");
    if (is_tok || is_detok) {
        if (check_auth(f, req, &e)) {
            send_error(f, c, &e);
            return;
        }
        if (!post) goto method;
        if (req->forwarded) f->forwarded_in++;
        handle_tokenize(f, c, req, body, len, is_detok, 1);
        return;
    }
    const struct front_ext *ext = atomic_load(&f->ext);
    if (!is_models && !is_cmpl && !is_chat && get && ext && ext->get) {
        size_t xlen = 0;
        e.status = 0;
        char *x = check_auth(f, req, &e) ? NULL : ext->get(ext->ctx, p, &xlen);
        if (x) {
            http_respond(c, 200, "application/json", x, xlen, NULL);
            free(x);
            return;
        }
        if (e.status) {
            send_error(f, c, &e);
            return;
        }
    }
    if (!is_models && !is_cmpl && !is_chat && post && ext && ext->post) {
        char *x = NULL;
        size_t xlen = 0;
        int rc = 1;
        /* With an API key, the key or a request signed with the cluster key; without one, only
         * the signature (the route checks it: ext->post). */
        int has_key = f->cfg.api_key && f->cfg.api_key[0];
        int key_ok = has_key && !check_auth(f, req, &e);
        if ((has_key && !key_ok && !req->signature[0]) ||
            (rc = ext->post(ext->ctx, req, body, len, key_ok, &x, &xlen, &e)) < 0) {
            send_error(f, c, &e);
            return;
        }
        if (!rc) {
            http_respond(c, 200, "application/json", x ? x : "{}", x ? xlen : 2, NULL);
            free(x);
            return;
        }
    }
    if (!is_models && !is_cmpl && !is_chat) {
        api_error_set(&e, 404, "invalid_request_error", NULL, "Unknown request URL: %s %s.",
                      req->method, p);
        send_error(f, c, &e);
        return;
    }
    if (check_auth(f, req, &e)) {
        send_error(f, c, &e);
        return;
    }
    if (is_models) {
        const struct front_model *m = atomic_load(&f->model);
        if (!get) goto method;
        if (!m) {
            api_error_set(&e, 503, "server_error", NULL, "The model is still loading.");
            send_error(f, c, &e);
            return;
        }
        handle_models(f, c, m);
        return;
    }
    if (!post) goto method;
    if (req->forwarded) f->forwarded_in++;
    handle_completion(f, c, req, body, len, is_chat, 1);
    return;
method:
    api_error_set(&e, 405, "invalid_request_error", NULL, "Method %s is not allowed for %s.",
                  req->method, p);
    send_error(f, c, &e);
}

static void on_abort(void *ctx, struct http_conn *c, void *user)
{
    struct front *f = ctx;
    struct front_req *fr = user;
    (void)c;
    struct scheduler *s = atomic_load(&f->sched);
    if (fr->r && s) sched_cancel(s, fr->r);
    if (fr->relay && !fr->probe)
        log_info("route", "client gone: the forward to node %llu is cancelled",
                 (unsigned long long)fr->node);
    fr->conn = NULL;
    front_req_free(fr);
}

void front_notify(void *ctx, struct sreq *r)
{
    struct front *f = ctx;
    if (atomic_exchange(&r->notify_pending, 1)) return;
    sreq_get(r);
    pthread_mutex_lock(&f->mu);
    r->notify_next = f->notify_head;
    f->notify_head = r;
    pthread_mutex_unlock(&f->mu);
}

void front_wake(void *ctx)
{
    struct front *f = ctx;
    if (f->http) http_server_wake(f->http);
}

static void on_wake(void *ctx)
{
    struct front *f = ctx;
    pthread_mutex_lock(&f->mu);
    struct sreq *r = f->notify_head;
    f->notify_head = NULL;
    pthread_mutex_unlock(&f->mu);
    /* The list is LIFO; order between requests does not matter. */
    while (r) {
        struct sreq *next = r->notify_next;
        atomic_store(&r->notify_pending, 0);
        if (r->user) deliver(f, r->user);
        sreq_put(r);
        r = next;
    }
    struct front_req *fr = f->relays, *fnext;
    for (; fr; fr = fnext) {
        fnext = fr->relay_next;
        relay_deliver(f, fr);
    }
    atomic_fetch_add(&f->wake_passes, 1);
}

/* The server's own errors in OpenAI's error shape, like every other error the API sends. */
static char *error_body(void *ctx, int status, const char *message)
{
    (void)ctx;
    struct api_error e;
    api_error_set(&e, status, status == 503 ? "server_error" : "invalid_request_error", NULL, "%s",
                  message);
    return api_error_json(&e);
}

struct http_handler front_handler(struct front *f)
{
    return (struct http_handler){.ctx = f,
                                 .on_request = on_request,
                                 .on_abort = on_abort,
                                 .on_wake = on_wake,
                                 .error_body = error_body};
}
