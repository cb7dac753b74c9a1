/* serve_front: the HTTP handlers of `strata serve` (run on the front thread).
 *
 * Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize,
 * POST /detokenize (llama.cpp's shapes: serving/api/tokenize_api.h), GET /health, GET /metrics,
 * GET / (the operator's page, serving/api/ui_page.h: open, its own fetches carry the key), GET
 * /v1/cluster/nodes/ID/metrics (member ID's /metrics, relayed through a forward channel; its own
 * here) and GET and POST routes of a front_ext (GET /v1/cluster, POST /v1/cluster/recover), behind
 * the API key like the others. A completion request is
 * authenticated (optional bearer key), validated (api_request), rendered (chat_template),
 * tokenized, checked against the context, and submitted to the scheduler; its output comes back
 * through front_notify (scheduler thread: queue the request, once) and front_wake (wake the front),
 * and is sent as one JSON body or as server-sent events ("data: {chunk}\n\n" ... "data:
 * [DONE]\n\n"). A client that disconnects cancels its request. Until front_set_ready(), completions
 * get 503 and /health reports the load progress.
 *
 * In a cluster (a front_ext with `route`), every completion asks the route where it goes before
 * it is submitted here, and also when this node has no model at all (an empty or scaled-down
 * member still answers): another node's API -> the request is relayed there (serving/api/relay.h)
 * and its answer streamed back through this connection; "local" -> served here; "none" (no
 * replica anywhere) -> served here when this node has the model loaded (its queue is the demand
 * the planner sees), else held by the relay until a replica appears (503 with Retry-After after
 * hold_ms). /tokenize and /detokenize are served here whenever this node has the model (and
 * the request's optional "model" names no other one), otherwise routed the same way. A request
 * carrying X-Strata-Forwarded on a connection from a cluster member (front_adopt: a sealed forward
 * channel) was relayed by another node and is never forwarded again; from a client the header is
 * ignored and the request routed like any other. Requests the API rejects (bad JSON, auth,
 * context length when the model is here) are answered by the node the client reached, as a
 * single node would.
 *
 * /health always carries "pid" and "processes" (entries of /proc/[0-9]*): on the appliance the
 * server is PID 1 and alone, and the boot tests check that. */
#ifndef STRATA_SERVE_FRONT_H
#define STRATA_SERVE_FRONT_H

#include "cluster/layer_progress.h"
#include "serving/api/chat_template.h"
#include "serving/api/http_server.h"
#include "serving/api/metrics.h"
#include "serving/sched/scheduler.h"

#include <stddef.h>
#include <stdint.h>

struct front_model {
    const char *name; /* model id in responses and /v1/models */
    int ctx, vocab_size;
    enum chat_template tmpl;
    void *tok; /* tokenizer context for encode */
    /* text -> ids with BOS (tokenizer_encode) */
    int (*encode)(void *tok, const char *text, size_t len, int *out, int cap, int *n, char *err);
    /* chat prompts with BOS, the template's markers parsed for special tokens (optional; NULL:
     * encode of the whole text). out has room for 2 * r->len + 3 ids. */
    int (*encode_chat)(void *tok, const struct chat_rendered *r, int *out, int cap, int *n,
                       char *err);
    /* POST /tokenize and /detokenize (serving/api/tokenize_api.h's token_ops; NULL: 501) */
    int (*tokenize)(void *tok, const char *text, size_t len, int add_special, int parse_special,
                    int *out, int cap, int *n, char *err);
    const char *(*piece)(void *tok, int id, char *scratch, size_t *len);
};

struct front_config {
    const char *api_key;               /* NULL: no authentication */
    int default_max_tokens_completion; /* OpenAI's legacy default is 16 */
    /* forwarding (0: defaults 3000 ms, 120000 ms, 20000 ms; see serving/api/relay.h) */
    int forward_connect_ms, forward_idle_ms, forward_hold_ms;
    /* a relayed request's first byte, across re-routes (0: forward_idle_ms; relay.h deadline_ms) */
    int forward_deadline_ms;
    /* channels to another node kept idle for its next request (0: one per request) and for how
     * long (0: 10000 ms; keep it under the other nodes' --idle-timeout-ms) */
    int forward_pool, forward_pool_idle_ms;
};

struct front;
struct api_error;

struct front *front_new(const struct front_config *cfg, struct serve_metrics *m, char *err);
void front_free(struct front *f);
/* Before ready: loading progress for /health ("loading weights", 0.4). Thread-safe. */
void front_set_progress(struct front *f, const char *stage, double fraction);
void front_set_server(struct front *f, struct http_server *s);
/* The node's weight progress: /health adds layers_resident, layers_total, bytes, bytes_total and
 * state (loading|partial|ready|failed); /metrics adds the per-layer series. Before the server. */
void front_set_layers(struct front *f, const struct layer_progress *lp);
/* The model and scheduler become visible to the front thread; completions are served. */
void front_set_ready(struct front *f, const struct front_model *model, struct scheduler *s);
/* The model goes away (its engine is about to be torn down): completions get 503 again and /health
 * reports `stage`. Returns once the front thread holds no pointer to the old model or scheduler
 * (at most 2 s). Not on the front thread. */
void front_set_unready(struct front *f, const char *stage);
struct http_handler front_handler(struct front *f);
/* Extensions served by other subsystems (the cluster's control plane): `get` answers GET routes
 * the front does not know (malloc'd JSON, NULL: 404), `metrics` appends text to /metrics, `route`
 * says where a completion of `model` (the request's "model", may be "") with prompt_tokens goes:
 * addr = "local", "none", or the chosen node's API "host:port" with *node its id (0, or -1 with
 * err). They run on the front thread, route also on relay threads: all must be thread-safe. Set
 * once; NULL fields are skipped. */
struct front_ext {
    void *ctx;
    char *(*get)(void *ctx, const char *path, size_t *len);
    char *(*metrics)(void *ctx, size_t *len);
    int (*route)(void *ctx, const char *model, int prompt_tokens, char *addr, size_t cap,
                 uint64_t *node, char *err);
    uint64_t node_id; /* this node's id: X-Strata-Forwarded of what it relays */
    /* A request was relayed to node (delta +1) or its relay ended (-1): what this node has in
     * flight at each other node, for the route (front thread). */
    void (*routed)(void *ctx, uint64_t node, int delta);
    /* A relay could not connect to node (nothing sent): route around it for a while. */
    void (*unreachable)(void *ctx, uint64_t node);
    /* A sealed channel to node for a relayed request (relay threads; relay_config.open_channel).
     * NULL: relays connect to the node's API over TCP. */
    int (*forward_open)(void *ctx, uint64_t node, int timeout_ms, int cancel_fd, char *err);
    /* POST routes the front does not know (front thread; may block briefly): 0 with *out
     * (malloc'd JSON, 200) and *out_len, -1 with e filled (status and reason), 1: not a route of
     * ext (404). They change state, so the route authenticates what the front could not: key_ok
     * says the request carried this node's API key; without it (no key set, or a request that
     * carries req->signature instead) the route checks the signature or refuses. */
    int (*post)(void *ctx, const struct http_request *req, const char *body, size_t len, int key_ok,
                char **out, size_t *out_len, struct api_error *e);
    /* 1 when a request for `model` ("" : this node's, or the cluster's only one) must fail at
     * once because the cluster lost it (no live node holds some of its layers), with why naming
     * the model and the missing layers: completions get 503 (code model_lost), held ones too,
     * and /health says so. Thread-safe (front and relay threads). */
    int (*lost)(void *ctx, const char *model, char *why, size_t cap);
    /* The API address of member node (GET /v1/cluster/nodes/ID/metrics: its /metrics through a
     * forward channel): 0, or -1 when node is no member. Front thread. */
    int (*member_api)(void *ctx, uint64_t node, char *addr, size_t cap);
};
void front_set_ext(struct front *f, const struct front_ext *ext);
/* Any thread: fd, a forward channel from cluster member from_node, becomes a connection of the
 * front's server (http_server_adopt): X-Strata-Forwarded counts on it (and must name from_node).
 * The front owns fd. */
int front_adopt(struct front *f, int fd, uint64_t from_node);
/* The model of the latest request held for lack of a replica ("" : none yet); any thread. The
 * count and prompt tokens of those held now are serve_metrics' no_replica, no_replica_tokens. */
void front_held_model(struct front *f, char *out, size_t cap);
/* sched_ops.notify / sched_ops.wake */
void front_notify(void *f, struct sreq *r);
void front_wake(void *f);

#endif
