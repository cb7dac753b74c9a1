/* strata serve: the OpenAI-compatible server.
 *
 * Order of start-up: PID-1 duties (os/runtime/pid1), the HTTP front (so /health answers 503 with
 * the load progress at once), the model (loader), the scheduler (its step-time model from the best
 * prior, nothing timed: serving/sched/step_prior.h; then its compute thread), then completions are
 * served: ready the moment the weights are. SIGTERM/SIGINT (or the power button as PID 1)
 * stop the front; running requests are ended and the process exits 0. */
#include "cluster/coop.h"
#include "cluster/fabric_node.h"
#include "cluster/layer_progress.h"
#include "cluster/weight_node.h"
#include "cluster/serve_cluster.h"
#include "cmd/cluster_opts.h"
#include "cmd/fabric_opts.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "os/runtime/esp.h"
#include "os/runtime/pid1.h"
#include "os/runtime/watchdog.h"
#include "serving/api/http_server.h"
#include "serving/sched/scheduler.h"
#include "serving/sched/step_prior.h"
#include "serving/api/serve_front.h"
#include "cmd/commands.h"
#include "cmd/options.h"
#include "cmd/test_hooks.h"
#include "serving/engine/loader.h"
#include "serving/engine/token_piece.h"

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct serve_opts {
    const char *model, *host, *api_key, *name;
    const char *state_dir; /* the step-model cache's directory; "off": none (step_prior.h) */
    int port, max_batch, ctx, threads, step_tokens, kv_blocks, kv_block_size, kv_type, static_batch;
    int max_conns, timeout_ms, idle_timeout_ms, no_slo, no_prefix_cache, verbose, shed_late,
        static_shrink;
    int forward_pool;        /* idle forward channels kept per node (serving/api/relay.h) */
    int forward_deadline_ms; /* a relayed request's first byte, across re-routes (0: 120 s) */
    struct test_hooks hooks; /* tests only (cmd/test_hooks.h) */
    double ttft_ms, tpot_ms, static_wait_ms;
    long max_body;
    struct fabric_opts fab; /* on the fabric when --fabric, --listen or --peers is given */
    double weight_rate_mbs; /* pacing of the weights this node sends, MB/s (0: unpaced) */
    int stop_the_world;     /* a pulling joiner serves only once every layer is here */
    /* cooperative execution (docs/cluster.md) */
    int resident_layers; /* -1: all (this node helps others) */
    const char *resident_schedule, *coop_dtype;
    int coop_timeout_ms;
    int coop_kv;       /* enum coop_kv */
    int coop_fuse;     /* helper: 1 remote steps inside our own (default), 0 between them */
    int coop_pipeline; /* joiner: 1 up to 2 steps in flight (default), 0 one at a time */
    long
        coop_kv_window; /* bytes of KV answers a helper sends between two of its steps (0: 4 MiB) */
    int helper_peer;    /* the coop helper's index in fab.peers (a chained joiner pulls from 0) */
    int alt_helpers
        [SC_MAX_OTHERS]; /* cluster: peers that serve the model too: helpers if ours dies */
    int n_alt_helpers;
    struct control_cfg cluster; /* the control plane, with --cluster (cluster/control.h) */
};

#define MAX_OPTS 96

static int parse_coop_kv(const char *v, void *dst, char *err)
{
    int m = coop_kv_parse(v);
    if (m < 0) return errmsg_set(err, "--coop-kv %s: want transfer, recompute, auto or compare", v);
    *(int *)dst = m;
    return 0;
}

static int parse_on_off(const char *v, void *dst, char *err)
{
    if (strcmp(v, "on") && strcmp(v, "off")) return errmsg_set(err, "%s: want on or off", v);
    *(int *)dst = !strcmp(v, "on");
    return 0;
}

/* serve's options, pointing into o: the one list the parser and the usage text read. */
static int serve_options(struct serve_opts *o, struct opt *t)
{
    const struct opt table[] = {
        {"-m", OPT_STR, &o->model, 0, 0, NULL, "MODEL.gguf"},
        {"--host", OPT_STR, &o->host, 0, 0, NULL, "ADDR"},
        {"--port", OPT_INT, &o->port, 0, 65535, NULL, "N"},
        {"--api-key", OPT_STR, &o->api_key, 0, 0, NULL, "KEY"},
        {"--name", OPT_STR, &o->name, 0, 0, NULL, "ID"},
        {"--state-dir", OPT_STR, &o->state_dir, 0, 0, NULL, "DIR|off"},
        {"--max-batch", OPT_INT, &o->max_batch, 1, 4096, NULL, "N"},
        {"--ctx", OPT_INT, &o->ctx, 0, 1 << 20, NULL, "N"},
        {"--threads", OPT_INT, &o->threads, 0, 1024, NULL, "N"},
        {"--step-tokens", OPT_INT, &o->step_tokens, 1, 65536, NULL, "N"},
        {"--kv-blocks", OPT_INT, &o->kv_blocks, 0, 1 << 24, NULL, "N"},
        {"--kv-block-size", OPT_INT, &o->kv_block_size, 1, 4096, NULL, "N"},
        {"--kv-type", OPT_PARSE, &o->kv_type, 0, 0, opts_kv_type, "f16|f32"},
        {"--ttft-ms", OPT_DOUBLE, &o->ttft_ms, 1, 3600000, NULL, "MS"},
        {"--tpot-ms", OPT_DOUBLE, &o->tpot_ms, 1, 3600000, NULL, "MS"},
        {"--no-slo", OPT_FLAG, &o->no_slo, 0, 0, NULL, NULL},
        {"--no-prefix-cache", OPT_FLAG, &o->no_prefix_cache, 0, 0, NULL, NULL},
        {"--shed-late", OPT_FLAG, &o->shed_late, 0, 0, NULL, NULL},
        {"--static-batch", OPT_INT, &o->static_batch, 0, 4096, NULL, "N"},
        {"--static-wait-ms", OPT_DOUBLE, &o->static_wait_ms, 0, 3600000, NULL, "MS"},
        {"--static-shrink", OPT_FLAG, &o->static_shrink, 0, 0, NULL, NULL},
        {"--max-conns", OPT_INT, &o->max_conns, 1, 1 << 20, NULL, "N"},
        {"--max-body", OPT_LONG, &o->max_body, 1024, 1L << 40, NULL, "BYTES"},
        {"--timeout-ms", OPT_INT, &o->timeout_ms, 1, 3600000, NULL, "MS"},
        {"--idle-timeout-ms", OPT_INT, &o->idle_timeout_ms, 1, 3600000, NULL, "MS"},
        {"--forward-pool", OPT_INT, &o->forward_pool, 0, 64, NULL, "N"},
        {"--forward-deadline-ms", OPT_INT, &o->forward_deadline_ms, 0, 3600000, NULL, "MS"},
        {"-v", OPT_FLAG, &o->verbose, 0, 0, NULL, NULL},
        {"--coop-dtype", OPT_STR, &o->coop_dtype, 0, 0, NULL, "f32|f16|bf16"},
        {"--coop-timeout-ms", OPT_INT, &o->coop_timeout_ms, 1, 3600000, NULL, "MS"},
        {"--coop-kv", OPT_PARSE, &o->coop_kv, 0, 0, parse_coop_kv, "transfer|recompute|auto"},
        {"--coop-fuse", OPT_PARSE, &o->coop_fuse, 0, 0, parse_on_off, "on|off"},
        {"--coop-pipeline", OPT_PARSE, &o->coop_pipeline, 0, 0, parse_on_off, "on|off"},
        {"--coop-kv-window", OPT_LONG, &o->coop_kv_window, 1, 1L << 30, NULL, "BYTES"},
        {"--weight-rate", OPT_DOUBLE, &o->weight_rate_mbs, 0, 1e6, NULL, "MB/s"},
        {"--stop-the-world", OPT_FLAG, &o->stop_the_world, 0, 0, NULL, NULL},
        {"--resident-layers", OPT_INT, &o->resident_layers, 0, 1 << 16, NULL, "K"},
        {"--resident-schedule", OPT_STR, &o->resident_schedule, 0, 0, NULL, "STEP:K,..."},
    };
    memcpy(t, table, sizeof table);
    int n = (int)(sizeof table / sizeof table[0]);
    n += fabric_options(&o->fab, t + n); /* the fabric's shared entries */
    n += test_hooks_serve_options(&o->hooks, t + n);
    return n + cluster_options(&o->cluster, t + n);
}

static int usage(void)
{
    struct serve_opts o;
    struct opt t[MAX_OPTS];
    opts_usage(stderr, "serve", t, serve_options(&o, t));
    fprintf(
        stderr,
        "  --state-dir: where the fitted step model is cached between starts (default: the\n"
        "  model's partition on the appliance, else $XDG_CACHE_HOME/strata; off: nowhere)\n"
        "  --resident-layers K, --resident-schedule STEP:K,...: a joiner that runs layers\n"
        "  [0, K) itself and the rest on its first --peers node (STEP:e:\n"
        "  the embedding arrives at STEP; until then the helper embeds token ids too);\n"
        "  --coop-dtype: the activations it sends, f32 exact (docs/cluster.md);\n"
        "  --coop-kv: how the KV of layers that become local arrives (auto: the faster by\n"
        "  measured costs; compare: both, timed and checked, for benchmarks);\n"
        "  --coop-fuse: a helper runs a joiner's steps inside its own (on, the default) or\n"
        "  between them (off: the baseline);\n"
        "  --coop-pipeline: a joiner computes its next step's layers while the helper runs the\n"
        "  last one's (on, the default; off: one step at a time);\n"
        "  --coop-kv-window: bytes of KV answers a helper sends between two of its steps\n"
        "  (default 4 MiB: what a transfer may add to one of its steps);\n"
        "  without -m, with --peers: pull the model from the peers into the arena and serve\n"
        "  with the first peer's help as soon as the header has verified and the peer is\n"
        "  connected, the embedding here or not (--stop-the-world: only once every\n"
        "  layer is here); --weight-rate paces the weights this node sends (docs/fabric.md)\n");
    test_hooks_usage(stderr);
    return 2;
}

static int parse_opts(int argc, char **argv, struct serve_opts *o)
{
    *o = (struct serve_opts){.host = "0.0.0.0",
                             .port = 8080,
                             .max_batch = 16,
                             .step_tokens = 256,
                             .kv_block_size = 16,
                             .max_conns = 512,
                             .timeout_ms = 10000,
                             .idle_timeout_ms = 30000,
                             .forward_pool = 4,
                             .ttft_ms = 1000,
                             .tpot_ms = 100,
                             .static_wait_ms = 50,
                             .hooks.hang_s = -1,
                             .max_body = 1 << 20,
                             .resident_layers = -1,
                             .coop_dtype = "f32",
                             .coop_fuse = 1,
                             .coop_pipeline = 1,
                             .cluster.remove_ms = CONTROL_REMOVE_MS};
    o->api_key = getenv("STRATA_API_KEY");
    struct opt t[MAX_OPTS];
    char err[ERRMSG_LEN];
    if (opts_parse(t, serve_options(o, t), argc, argv, err)) {
        fprintf(stderr, "strata serve: %s\n", err);
        return -1;
    }
    if (!o->model && !o->fab.peers.n && !control_enabled(&o->cluster)) {
        fprintf(stderr, "strata serve: -m MODEL.gguf is required (or --peers to pull it from, or "
                        "--cluster to wait for the planner)\n");
        return -1;
    }
    if (!o->model && !o->fab.peers.n && (!o->fab.kind || !o->fab.listen)) {
        fprintf(stderr, "strata serve: a cluster member without a model needs --fabric and "
                        "--listen (it pulls the model when the planner scales it up)\n");
        return -1;
    }
    int joiner = o->resident_layers >= 0 || o->resident_schedule;
    if (joiner && !o->fab.peers.n) {
        fprintf(stderr, "strata serve: --resident-layers/--resident-schedule need --peers (the "
                        "helper that runs the other layers)\n");
        return -1;
    }
    if (joiner && o->static_batch) {
        fprintf(stderr, "strata serve: --static-batch and cooperative execution do not mix\n");
        return -1;
    }
    if (strcmp(o->coop_dtype, "f32") && strcmp(o->coop_dtype, "f16") &&
        strcmp(o->coop_dtype, "bf16")) {
        fprintf(stderr, "strata serve: --coop-dtype %s: want f32, f16 or bf16\n", o->coop_dtype);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- glue to the engine */

struct serve {
    struct loaded_model *lm;
    struct http_server *http;
    struct front *front;
    struct serve_metrics metrics;
    struct fabric_node *fabric;  /* NULL when not on the fabric */
    struct coop *coop;           /* with the fabric */
    struct weight_node *weights; /* the model offered to / pulled from peers (fabric) */
    struct layer_progress layers;
    struct serve_cluster *cluster; /* with --cluster */
    int member;                    /* an empty member's join: failures are not fatal */
    /* the step-model cache (serving/sched/step_prior.h): written from the compute thread once
     * idle calibration is done, read at start-up only */
    struct step_identity step_id;
    char state_dir[4096]; /* "" : none */
    int state_remount;
    long prior_steps; /* the steps the cached prior was fitted from (0: not cached) */
};

/* The serving process's fabric node (cluster/fabric_node.h); its users (cooperative execution)
 * register on it before fabric_node_start. */
static struct fabric_node *fabric_open(const struct serve_opts *o, char *err)
{
    struct fabric_node_config fc = {
        .peers = o->fab.peers.v, .n_peers = o->fab.peers.n, .node_id = o->fab.node_id};
    if (auth_init(err) || fabric_opts_config(&o->fab, &fc.tp, err)) return NULL;
    return fabric_node_new(&fc, err);
}

static int engine_step(void *ctx, const struct batch *b, float *logits, char *err)
{
    if (!engine_forward(ctx, b, logits)) return 0;
    return errmsg_set(err, "%s", engine_error(ctx));
}

static const char *decode_piece(void *ctx, int prev, int id, char *scratch, size_t *len)
{
    return tokenizer_decode(ctx, prev, id, scratch, len);
}

static int encode_text(void *tok, const char *text, size_t len, int *out, int cap, int *n,
                       char *err)
{
    return tokenizer_encode(tok, text, len, 1, out, cap, n, err);
}

static int encode_chat(void *tok, const struct chat_rendered *r, int *out, int cap, int *n,
                       char *err)
{
    struct tok_span *sp = malloc(((size_t)r->n_spans + 1) * sizeof *sp);
    if (!sp) return errmsg_set(err, "serve: out of memory");
    for (int i = 0; i < r->n_spans; i++)
        sp[i] = (struct tok_span){r->text + r->spans[i].off, r->spans[i].len, r->spans[i].marker};
    int rc = tokenizer_encode_spans(tok, sp, r->n_spans, 1, out, cap, n, err);
    free(sp);
    return rc;
}

/* POST /tokenize: llama.cpp's tokenize with add_special and parse_special */
static int tokenize_text(void *tok, const char *text, size_t len, int add_special,
                         int parse_special, int *out, int cap, int *n, char *err)
{
    struct tok_span sp = {text, len, parse_special};
    return tokenizer_encode_spans(tok, &sp, 1, add_special, out, cap, n, err);
}

static const char *piece_of(void *tok, int id, char *scratch, size_t *len)
{
    return token_piece(tok, id, scratch, len);
}

static void on_progress(void *ctx, int done, int total)
{
    struct serve *sv = ctx;
    char stage[64];
    snprintf(stage, sizeof stage, "loading weights: span %d/%d", done, total);
    front_set_progress(sv->front, stage, total ? 0.9 * done / total : 0);
}

static struct http_server *volatile stop_target;

/* Requests in progress get this long to finish on SIGTERM (PID 1 powers off after
 * PID1_GRACE_S). */
#define SHUTDOWN_GRACE_MS 5000

static atomic_int stopping; /* a loading joiner gives up waiting */

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stopping, 1);
    if (stop_target) http_server_shutdown(stop_target, SHUTDOWN_GRACE_MS);
}

static void on_shutdown(void *ctx)
{
    atomic_store(&stopping, 1);
    http_server_shutdown(ctx, SHUTDOWN_GRACE_MS);
}

static volatile int serve_ready;

/* The serve loop's heartbeat; with --test-hang S it stops beating S seconds after the model is
 * ready, as a deadlocked loop would (the watchdog test). */
static struct scheduler *_Atomic tick_sched; /* for serve_tick, once the scheduler runs */

/* The serve loop's tick (the front thread): PID-1 duties, and the watchdog is petted only while
 * the compute thread is alive too: a step running for over half the watchdog's timeout is a hang,
 * and the hardware then resets the machine (strata.watchdog). */
static void serve_tick(void *ctx)
{
    const struct serve_opts *o = ctx;
    static int said;
    struct scheduler *sched = atomic_load(&tick_sched);
    double stuck = sched && watchdog_active() ? sched_step_running_for(sched) : 0;
    if (stuck > watchdog_timeout() / 2.0) {
        if (!said++)
            log_error("serve",
                      "the compute thread has been in one step for %.0f s: no longer "
                      "petting the watchdog",
                      stuck);
        return;
    }
    pid1_tick();
    test_hooks_tick(&o->hooks, serve_ready);
}

static void *http_main(void *arg)
{
    struct serve *sv = arg;
    char err[ERRMSG_LEN];
    if (http_server_run(sv->http, err)) log_error("serve", "%s", err);
    return NULL;
}

static const char *model_name(const struct serve_opts *o, const char *path, char *buf, size_t n)
{
    if (o->name) { /* into buf too: the caller may keep buf */
        snprintf(buf, n, "%s", o->name);
        return buf;
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(buf, n, "%s", base);
    char *dot = strstr(buf, ".gguf");
    if (dot) *dot = 0;
    return buf;
}

/* Fabric thread: the joiner's resident layers grew. Cooperative execution (cluster/coop.h)
 * takes k from here (coop_set_resident); /health and /metrics read sv->layers. */
static void on_resident(void *ctx, int k)
{
    struct serve *sv = ctx;
    if (sv->coop) coop_set_resident(sv->coop, k);
    if (sv->cluster) serve_cluster_resident(sv->cluster, k);
    char stage[64];
    int L = atomic_load(&sv->layers.layers_total);
    snprintf(stage, sizeof stage, "pulling weights: %d/%d layers resident", k, L);
    front_set_progress(sv->front, stage, L ? 0.9 * k / L : 0);
}

/* Fabric thread: the embedding table verified; until then the joiner's steps ran on the helper
 * from token ids. */
static void on_embedding(void *ctx)
{
    struct serve *sv = ctx;
    if (sv->coop) coop_set_embedding_local(sv->coop);
}

/* The model: from the file (-m), offered to peers when on the fabric; or, with --peers and no
 * -m, pulled from them into the arena: this returns once the header has arrived and the engine
 * exists (the rest arrives while the node serves). */
static int load_model(struct serve *sv, const struct serve_opts *o, struct loader_opts *lo,
                      char *err)
{
    layer_progress_init(&sv->layers);
    front_set_layers(sv->front, &sv->layers);
    if (fabric_opts_given(&o->fab) && !(sv->fabric = fabric_open(o, err)))
        return errmsg_prefix(err, "fabric: ");
    struct weight_node_config wc = {.fabric = sv->fabric,
                                    .peers = o->fab.peers.v,
                                    .n_peers = o->fab.peers.n,
                                    .rate_bytes = o->weight_rate_mbs * 1e6,
                                    .lp = &sv->layers,
                                    .on_resident = on_resident,
                                    .on_embedding = on_embedding,
                                    .ctx = sv};
    if (o->model) {
        /* A fabric source loads in GGUF's layout, what its manifest's CRCs are of; then
         * weight_node_source repacks it (peers still get GGUF's bytes). */
        lo->limits.keep_layout = sv->fabric != NULL;
        if (loader_open(sv->lm, o->model, lo, err)) return -1;
        const struct model *m = &sv->lm->model;
        layer_progress_full(&sv->layers, m->cfg.n_layers, m->n_spans, m->image_size);
        char name_buf[128];
        if (sv->fabric &&
            !(sv->weights = weight_node_source(
                  &wc, sv->lm, model_name(o, o->model, name_buf, sizeof name_buf), err)))
            return -1;
        return 0;
    }
    front_set_progress(sv->front, "pulling weights: waiting for the header", 0);
    if (!(sv->weights = weight_node_joiner(&wc, sv->lm, lo, err))) return -1;
    /* Until the header has arrived and the engine exists, this thread drives the stream
     * (cooperative execution needs the engine before the fabric thread starts); then the fabric
     * thread goes on with the rest. */
    struct tp *t = fabric_node_tp(sv->fabric);
    while (!weight_node_engine_ready(sv->weights)) {
        tp_poll(t, 5);
        weight_node_step(sv->weights);
        const char *why = weight_node_failed(sv->weights);
        if (why) return errmsg_set(err, "fabric: weights: %.400s", why);
        if (atomic_load(&stopping)) return errmsg_set(err, "stopped while pulling the weights");
    }
    return 0;
}

/* A pulling joiner serves once it can: its header verified (the engine exists, which is how we got
 * here) and its helper (the first peer) connected, the embedding here or not (without it the
 * helper runs the embedding too: cluster/coop.h); or when every layer is here (--stop-the-world:
 * only then). */
static int wait_servable(struct serve *sv, const struct serve_opts *o, char *err)
{
    int said = 0;
    while (!weight_node_complete(sv->weights)) {
        const char *why = weight_node_failed(sv->weights);
        if (why) return errmsg_set(err, "fabric: weights: %.400s", why);
        if (atomic_load(&stopping)) return errmsg_set(err, "stopped while pulling the weights");
        if (!o->stop_the_world && fabric_node_peer_open(sv->fabric, o->helper_peer)) {
            if (!weight_node_embedding_ready(sv->weights))
                log_info("serve",
                         "serving while partial, with the embedding remote: 0/%d layers here, "
                         "the embedding and every layer on %s until they arrive",
                         sv->lm->model.cfg.n_layers, o->fab.peers.v[o->helper_peer]);
            else
                log_info("serve", "serving while partial: %d/%d layers here, the rest on %s",
                         weight_node_k(sv->weights), sv->lm->model.cfg.n_layers,
                         o->fab.peers.v[o->helper_peer]);
            return 0;
        }
        if (!said && !o->stop_the_world) {
            log_info("serve", "waiting for the helper %s (or every layer)",
                     o->fab.peers.v[o->helper_peer]);
            said = 1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    log_info("serve", "weights complete: %d layers resident", sv->lm->model.cfg.n_layers);
    return 0;
}

/* A start-up step failed: as PID 1 that is strata.on_error; elsewhere one line on stderr, and the
 * HTTP front (if it runs) stops so the process can exit. Returns -1. */
static int serve_failed(struct serve *sv, const char *what, const char *err)
{
    char msg[ERRMSG_LEN + 64];
    snprintf(msg, sizeof msg, "serve: %s%s", what, err);
    if (sv->member) { /* the join failed; the node stays a member and says so */
        log_error("serve", "%s", msg);
        return -1;
    }
    if (pid1_active()) pid1_fatal(msg);
    fprintf(stderr, "strata %s\n", msg);
    if (sv->http) http_server_stop(sv->http);
    return -1;
}

/* The HTTP front first, so /health answers 503 with the load progress at once; PID-1 duties
 * before any other thread exists; then the front's thread. */
static int start_front(struct serve *sv, struct serve_opts *o, pthread_t *thread, char *err)
{
    metrics_init(&sv->metrics);
    atomic_store(&sv->metrics.slo_ttft_us, (unsigned long long)(o->ttft_ms * 1e3));
    atomic_store(&sv->metrics.slo_tpot_us, (unsigned long long)(o->tpot_ms * 1e3));
    /* A kept channel is the other node's idle keep-alive connection: give it up well before that
     * node's --idle-timeout-ms (the same on every node of a rack) closes it. */
    struct front_config fc = {.api_key = o->api_key,
                              .forward_pool = o->forward_pool,
                              .forward_deadline_ms = o->forward_deadline_ms,
                              .forward_pool_idle_ms = o->idle_timeout_ms / 2};
    if (!(sv->front = front_new(&fc, &sv->metrics, err))) pid1_fatal(err);
    struct http_server_config hc = {.host = o->host,
                                    .port = o->port,
                                    .max_conns = o->max_conns,
                                    .max_head = 16384,
                                    .max_body = (size_t)o->max_body,
                                    .read_timeout_ms = o->timeout_ms,
                                    .idle_timeout_ms = o->idle_timeout_ms,
                                    .write_timeout_ms = o->timeout_ms,
                                    .max_pending_write = 8u << 20,
                                    .tick = serve_tick,
                                    .tick_ctx = o};
    struct http_handler h = front_handler(sv->front);
    if (!(sv->http = http_server_new(&hc, &h, &sv->metrics, err))) return serve_failed(sv, "", err);
    front_set_server(sv->front, sv->http);
    if (pid1_init(on_shutdown, sv->http, err)) pid1_fatal(err);
    signal(SIGPIPE, SIG_IGN);
    if (!pid1_active()) {
        stop_target = sv->http;
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    if (pthread_create(thread, NULL, http_main, sv)) pid1_fatal("serve: pthread_create");
    fprintf(stderr, "strata serve: listening on %s:%d, loading %s\n", o->host,
            http_server_port(sv->http), o->model ? o->model : "the model from the fabric peers");
    return 0;
}

/* The model: from the file (-m), or pulled from the fabric peers into the arena. */
static int start_model(struct serve *sv, const struct serve_opts *o, char *err)
{
    struct loader_opts lo = {
        .limits = {.max_tokens = o->step_tokens,
                   .max_seqs = o->static_batch ? o->static_batch : o->max_batch,
                   .ctx = o->ctx,
                   .kv_block_size = o->kv_block_size,
                   .kv_blocks = o->kv_blocks,
                   .kv_type = o->kv_type,
                   .threads = o->threads},
        .arena_flags = pid1_active() ? 0 : ARENA_NO_LOCK,
        .verbose = o->verbose,
        .progress = on_progress,
        .progress_ctx = sv};
    if (!(sv->lm = calloc(1, sizeof *sv->lm))) return serve_failed(sv, "", "out of memory");
    if (load_model(sv, o, &lo, err)) return serve_failed(sv, "", err);
    return 0;
}

/* On the fabric: cooperative execution. A node holding every layer helps peers that hold fewer; a
 * joiner (pulling its weights, or told its resident layers for tests) runs [0, k) and the rest on
 * its first peer. A pulling node starts the fabric now and waits until it can serve. */
static int start_coop(struct serve *sv, const struct serve_opts *o, char *err)
{
    struct engine *e = &sv->lm->engine;
    int L = sv->lm->model.cfg.n_layers, pulling = !o->model;
    int joiner = o->resident_layers >= 0 || o->resident_schedule || pulling;
    int resident = o->resident_layers >= 0 ? (o->resident_layers < L ? o->resident_layers : L)
                   : o->resident_schedule  ? 0
                   : pulling               ? weight_node_k(sv->weights)
                                           : L;
    struct coop_config cc = {.fabric = sv->fabric,
                             .e = e,
                             .m = &sv->metrics,
                             .eos_id = sv->lm->tok.eos_id,
                             .bos_id = sv->lm->tok.model == TOK_SPM ? sv->lm->tok.bos_id : -1,
                             .eog_ids = sv->lm->tok.eog_ids,
                             .n_eog = sv->lm->tok.n_eog,
                             .resident = resident,
                             /* nothing arrives before fabric_node_start: this stays true until
                              * on_embedding, which needs sv->coop, set first */
                             .embedding_remote =
                                 pulling && !weight_node_embedding_ready(sv->weights),
                             .schedule = o->resident_schedule,
                             .helper_peer = joiner ? o->helper_peer : -1,
                             .alt_helpers = o->alt_helpers,
                             .n_alt_helpers = joiner ? o->n_alt_helpers : 0,
                             .dtype = !strcmp(o->coop_dtype, "f16")    ? WIRE_F16
                                      : !strcmp(o->coop_dtype, "bf16") ? WIRE_BF16
                                                                       : WIRE_F32,
                             .timeout_ms = o->coop_timeout_ms,
                             .kv_mode = o->coop_kv,
                             /* a cluster member that completes its join can help the next */
                             .serve_remote = !joiner || control_enabled(&o->cluster),
                             .fuse = o->coop_fuse,
                             .pipeline = o->coop_pipeline,
                             .kv_window = (size_t)o->coop_kv_window,
                             /* a cluster member that leaves the engine hands over what runs */
                             .handover = control_enabled(&o->cluster),
                             .test_kv_fault = o->hooks.kv_fault};
    if (!(sv->coop = coop_new(&cc, err)) || coop_attach(sv->coop, err) ||
        (pulling && fabric_node_start(sv->fabric, err)) || (pulling && wait_servable(sv, o, err)))
        return serve_failed(sv, "fabric: ", err);
    if (pulling) coop_set_resident(sv->coop, weight_node_k(sv->weights)); /* k so far */
    if (joiner)
        log_info("serve", "joiner: layers [0, %d) of %d here, the rest on %s (%s activations)",
                 resident, L, o->fab.peers.v[o->helper_peer], o->coop_dtype);
    else
        log_info("serve", "all %d layers here: helping peers that hold fewer", L);
    return 0;
}

/* Compute thread: idle calibration covered every step shape; the model goes to the cache. */
static void on_calibrated(void *ctx, const struct step_model *m, double err, long steps)
{
    struct serve *sv = ctx;
    if (!sv->state_dir[0]) return;
    struct step_cached c = {.m = *m, .err = err, .steps = sv->prior_steps + steps};
    char e[ERRMSG_LEN], path[4200];
    step_cache_path(path, sizeof path, sv->state_dir, &sv->step_id);
    if (step_prior_save(sv->state_dir, sv->state_remount, &sv->step_id, &c, e))
        log_warn("serve", "step model not cached: %s", e);
    else
        log_info("serve", "step model: saved to %s", path);
}

/* The step model to start from (step_prior.h), said in one line: nothing is timed before serving
 * (idle calibration covers what the steps do not, once, and caches the result). */
static void step_prior_start(struct serve *sv, const struct serve_opts *o, struct scheduler *sched)
{
    char dir[4096];
    int remount = 0;
    int none = step_state_dir(o->state_dir, o->model, pid1_active(), dir, sizeof dir, &remount);
    snprintf(sv->state_dir, sizeof sv->state_dir, "%s", none ? "" : dir);
    sv->state_remount = remount;
    step_identity_of(sv->lm, &sv->step_id);
    /* a cluster member with the same model on the same hardware (its load reports) */
    struct step_member mem, *member = NULL;
    double merr;
    int mcal;
    uint64_t mnode;
    if (serve_cluster_member_step(sv->cluster, step_identity_hash(&sv->step_id), &mem.m, &merr,
                                  &mcal, &mnode)) {
        double k = mem.m.corr > 0 ? mem.m.corr : 1;
        mem.m = (struct step_model){mem.m.a * k, mem.m.b * k, mem.m.c * k, 1};
        mem.err = merr;
        mem.calibrated = mcal;
        mem.node = mnode;
        member = &mem;
    }
    struct step_prior p;
    step_prior_choose(sv->lm, &sv->step_id, none ? NULL : dir, member, o->model != NULL, &p);
    int cached = p.source == STEP_FROM_CACHE;
    sv->prior_steps = cached ? p.steps : 0;
    sched_set_prior(sched, &p.m, p.err, p.calibrated);
    char what[4400];
    if (cached)
        snprintf(what, sizeof what, "cached in %s, fitted on this hardware", p.path);
    else if (p.source == STEP_FROM_MEMBER)
        snprintf(what, sizeof what, "node %llu's, fitted on the same hardware%s", p.node,
                 p.calibrated ? " over every calibration shape" : "");
    else if (p.bw > 0)
        snprintf(what, sizeof what, "a default from %.0f MiB of weights read at %.1f GB/s",
                 (double)sv->lm->model.image_size / (1 << 20), p.bw / 1e9);
    else
        snprintf(what, sizeof what, "a default from %.0f MiB of weights (bandwidth not measured)",
                 (double)sv->lm->model.image_size / (1 << 20));
    fprintf(stderr,
            "strata serve: step model: %s%.1f us/token + %.1f us/sequence + %.1f us, error %.0f%% "
            "(%s; %s)\n",
            cached ? "" : "prior ", p.m.a * 1e6, p.m.b * 1e6, p.m.c * 1e6, p.err * 100, what,
            p.calibrated ? "corrected by every step"
                         : "corrected by every step, calibrated while idle");
}

/* The compute thread, serving at once: its step model starts from the best prior and is corrected
 * online (a node whose weights are still arriving too). */
static int start_scheduler(struct serve *sv, const struct serve_opts *o, struct scheduler **out,
                           char *err)
{
    struct engine *e = &sv->lm->engine;
    int pulling = !o->model;
    struct sched_config sc = {.max_seqs = e->lim.max_seqs,
                              .max_step_tokens = e->lim.max_tokens,
                              .ctx = e->lim.ctx,
                              .static_batch = o->static_batch,
                              .static_wait_ms = o->static_wait_ms,
                              .ttft_ms = o->ttft_ms,
                              .tpot_ms = o->tpot_ms,
                              .no_slo_admission = o->no_slo,
                              .no_prefix_cache = o->no_prefix_cache,
                              .shed_late = o->shed_late,
                              .static_shrink = o->static_shrink,
                              .step_delay_us = o->hooks.step_delay_us};
    struct sched_ops ops = {.ctx = e,
                            .vocab_size = sv->lm->model.cfg.vocab_size,
                            .eos_id = sv->lm->tok.eos_id,
                            /* only llama2.c-era models end a story with BOS */
                            .bos_id = sv->lm->tok.model == TOK_SPM ? sv->lm->tok.bos_id : -1,
                            .eog_ids = sv->lm->tok.eog_ids,
                            .n_eog = sv->lm->tok.n_eog,
                            .forward = engine_step,
                            .decode_ctx = &sv->lm->tok,
                            .decode = decode_piece,
                            .notify_ctx = sv->front,
                            .notify = front_notify,
                            .wake = front_wake,
                            .model_ctx = sv,
                            .calibrated = on_calibrated};
    if (sv->coop) ops.coop = coop_sched_hooks(sv->coop);
    struct scheduler *sched = *out = sched_new(&sc, &ops, &e->kv, &sv->metrics, err);
    if (!sched) return serve_failed(sv, "", err);
    if (sv->coop) coop_set_scheduler(sv->coop, sched);
    step_prior_start(sv, o, sched);
    if (sched_start(sched, err) || (sv->fabric && !pulling && fabric_node_start(sv->fabric, err)))
        return serve_failed(sv, "", err);
    return 0;
}

/* Requests are served from here on (/health 200). On the appliance, the boot slot that got us
 * here is marked good, so systemd-boot stops counting its tries (os/runtime/esp.h). */
static void announce_ready(struct serve *sv, const struct serve_opts *o, struct scheduler *sched,
                           char *name_buf, size_t name_cap)
{
    const struct engine *e = &sv->lm->engine;
    struct gguf_str tmpl = {0};
    gguf_get_str(&sv->lm->gguf, "tokenizer.chat_template", &tmpl, NULL);
    struct front_model fm = {.name = model_name(o, sv->lm->path, name_buf, name_cap),
                             .ctx = e->lim.ctx,
                             .vocab_size = sv->lm->model.cfg.vocab_size,
                             .tmpl = chat_template_detect(tmpl.p, tmpl.len),
                             .tok = &sv->lm->tok,
                             .encode = encode_text,
                             .encode_chat = encode_chat,
                             .tokenize = tokenize_text,
                             .piece = piece_of};
    front_set_ready(sv->front, &fm, sched);
    fprintf(stderr,
            "strata serve: ready: %s on %s:%d (ctx %d, max batch %d, %d tokens/step, %d %s KV "
            "blocks of %d, chat template %s%s)\n",
            fm.name, o->host, http_server_port(sv->http), e->lim.ctx, e->lim.max_seqs,
            e->lim.max_tokens, e->kv.n_blocks, kv_type_name(e->kv.type), e->kv.block_size,
            chat_template_name(fm.tmpl), o->static_batch ? ", STATIC batching" : "");
    serve_ready = 1;
    atomic_store(&tick_sched, sched);
    test_hooks_ready(&o->hooks);
    if (pid1_active()) {
        char msg[ERRMSG_LEN + 64], err[ERRMSG_LEN];
        if (esp_bless_booted(msg, sizeof msg, err))
            log_warn("serve", "boot slot: %s", err);
        else
            log_info("serve", "boot slot: %s", msg);
    }
}

/* The cluster's control thread (cluster/serve_cluster.h), with --cluster only; sched is NULL for
 * an empty member (model NULL). */
static int start_control(struct serve *sv, struct serve_opts *o, struct scheduler *sched,
                         const char *model, char *err)
{
    if (!control_enabled(&o->cluster)) return 0;
    static char http_addr[80];
    snprintf(http_addr, sizeof http_addr, "%s:%d", o->host, http_server_port(sv->http));
    o->cluster.http = http_addr;
    o->cluster.fabric = o->fab.listen;
    o->cluster.id = (uint64_t)o->fab.node_id;
    o->cluster.key_file = o->fab.key_file;
    o->cluster.model = model;
    o->cluster.n_layers = sched ? sv->lm->model.cfg.n_layers : 0;
    o->cluster.model_bytes = sched ? (double)sv->lm->model.image_size : 0;
    o->cluster.ttft_slo_ms = o->ttft_ms;
    o->cluster.tpot_slo_ms = o->tpot_ms;
    o->cluster.max_step_tokens = sched ? sv->lm->engine.lim.max_tokens : 0;
    /* a flag, so an empty member (the leader, often) knows it before it holds a model */
    o->cluster.max_seqs = o->static_batch ? o->static_batch : o->max_batch;
    /* a stream from here is paced (--weight-rate) or the fabric's rate is set (--link-gbps) */
    o->cluster.link_cap_Bps =
        o->weight_rate_mbs > 0 ? o->weight_rate_mbs * 1e6 : o->fab.link_gbps * 1e9 / 8;
    sv->cluster = serve_cluster_start(&o->cluster, sv->front, &sv->metrics, sched,
                                      sched ? sv->lm->engine.lim.max_tokens : 0, err);
    if (!sv->cluster) return serve_failed(sv, "", err);
    serve_cluster_set_coop(sv->cluster, sv->coop);
    if (sched) serve_cluster_set_step_id(sv->cluster, step_identity_hash(&sv->step_id));
    return 0;
}

/* The model, cooperative execution (on the fabric), the compute thread, ready. */
static int bring_up(struct serve *sv, struct serve_opts *o, struct scheduler **sched, char *name,
                    size_t name_cap, char *err)
{
    int rc = start_model(sv, o, err);
    if (!rc && fabric_opts_given(&o->fab)) rc = start_coop(sv, o, err);
    if (!rc) rc = start_scheduler(sv, o, sched, err);
    if (!rc) announce_ready(sv, o, *sched, name, name_cap);
    return rc;
}

/* The engine goes (a cluster member's host copy is dropped, or its join failed): the front stops
 * taking completions, those already running finish, then every part stops in the reverse order
 * of bring_up. The HTTP front and the control thread stay. */
static void tear_down(struct serve *sv, struct scheduler **sched, const char *stage)
{
    front_set_unready(sv->front, stage);
    for (int i = 0;
         i < 3000 && (atomic_load(&sv->metrics.running) || atomic_load(&sv->metrics.waiting));
         i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    front_set_unready(sv->front, stage); /* their last notifications are delivered */
    if (sv->cluster) serve_cluster_detach(sv->cluster);
    serve_ready = 0;
    atomic_store(&tick_sched, NULL);
    if (*sched) sched_free(*sched);
    *sched = NULL;
    fabric_node_stop(sv->fabric);
    weight_node_free(sv->weights);
    fabric_node_free(sv->fabric);
    coop_free(sv->coop);
    if (sv->lm) {
        loader_close(sv->lm);
        free(sv->lm);
    }
    sv->weights = NULL;
    sv->fabric = NULL;
    sv->coop = NULL;
    sv->lm = NULL;
}

/* Control thread, during a join: a node holding the model whole (back, or new) is pulled from
 * and may take over as the helper, at once (cluster/serve_cluster.h serve_cluster_on_holder). */
static void on_holder(void *ctx, const char *fabric, int serves)
{
    struct serve *sv = ctx;
    weight_node_add_holder(sv->weights, fabric);
    int peer = fabric_node_add_peer(sv->fabric, fabric);
    if (serves && peer >= 0 && sv->coop) coop_add_helper(sv->coop, peer);
}

/* A cluster member: wait for the planner's decisions that need this thread. A join pulls the
 * model from the source (or the joiner before us in the chain) and serves with the source's help
 * while it arrives; a drop frees it. Runs until the front stops. */
static void member_loop(struct serve *sv, struct serve_opts *o, struct scheduler **sched,
                        char *name, size_t name_cap)
{
    static char peer_buf[2 + SC_MAX_OTHERS][CL_STR_LEN + 1];
    char err[ERRMSG_LEN];
    struct sc_job job;
    while (!serve_cluster_wait_job(sv->cluster, &job, &stopping)) {
        if (job.kind == SC_JOB_DROP) {
            if (!sv->lm) continue;
            log_info("serve", "cluster: dropping %s from this node", job.model);
            tear_down(sv, sched, "empty: waiting for the planner");
            serve_cluster_dropped(sv->cluster);
            continue;
        }
        if (sv->lm && job.drop_first[0]) { /* a switch: the other model goes first */
            tear_down(sv, sched, "switching models");
            serve_cluster_switched(sv->cluster, &job);
        }
        if (sv->lm) continue; /* a model is here already: the executor said so */
        o->model = NULL;
        o->name = job.model;
        o->fab.peers.n = 0;
        o->helper_peer = 0;
        o->n_alt_helpers = 0;
        if (job.upstream_fabric[0]) {
            snprintf(peer_buf[0], sizeof peer_buf[0], "%s", job.upstream_fabric);
            o->fab.peers.v[o->fab.peers.n++] = peer_buf[0];
            o->helper_peer = 1;
        }
        snprintf(peer_buf[1], sizeof peer_buf[1], "%s", job.source_fabric);
        o->fab.peers.v[o->fab.peers.n++] = peer_buf[1];
        for (int i = 0; i < job.n_other; i++) { /* the stream resumes from these */
            snprintf(peer_buf[2 + i], sizeof peer_buf[2 + i], "%s", job.other_fabric[i]);
            if (job.other_serves[i]) o->alt_helpers[o->n_alt_helpers++] = o->fab.peers.n;
            o->fab.peers.v[o->fab.peers.n++] = peer_buf[2 + i];
        }
        log_info("serve", "cluster: pulling %s from %s, helper %s", job.model, o->fab.peers.v[0],
                 job.source_fabric);
        sv->member = 1;
        if (bring_up(sv, o, sched, name, name_cap, err)) {
            serve_cluster_join_failed(sv->cluster, err);
            tear_down(sv, sched, "empty: the last join failed (see the log)");
            continue;
        }
        serve_cluster_attach(sv->cluster, *sched, job.model, sv->lm->model.cfg.n_layers,
                             (double)sv->lm->model.image_size, sv->lm->engine.lim.max_tokens);
        serve_cluster_set_coop(sv->cluster, sv->coop);
        serve_cluster_set_step_id(sv->cluster, step_identity_hash(&sv->step_id));
        serve_cluster_resident(sv->cluster, weight_node_k(sv->weights));
        serve_cluster_on_holder(sv->cluster, on_holder, sv);
    }
}

/* A clean stop: a model that served steps since start knows more than the cache, which it
 * replaces (only the calibrated shapes are timed while idle; the rest come from the steps). */
static void step_cache_refresh(struct serve *sv, struct scheduler *sched)
{
    long served = (long)atomic_load(&sv->metrics.steps);
    if (!sched || served < 32 || !sched_calibrated(sched)) return;
    sched_stop(sched);
    on_calibrated(sv, sched_step_model(sched), sched_step_err(sched), served);
}

static void serve_free(struct serve *sv, struct serve_opts *o, struct scheduler *sched)
{
    step_cache_refresh(sv, sched);
    if (sched) sched_free(sched);
    fabric_node_stop(sv->fabric); /* the weight stream's connections close before the transport */
    weight_node_free(sv->weights);
    fabric_node_free(sv->fabric);
    coop_free(sv->coop);
    fabric_opts_free(&o->fab);
    fprintf(stderr, "strata serve: stopped\n");
    http_server_free(sv->http);
    front_free(sv->front);
    if (sv->lm) {
        loader_close(sv->lm);
        free(sv->lm);
    }
}

/* Start-up in order: the front, the model, cooperative execution (on the fabric), the compute
 * thread, ready, the control plane; then serve until the front stops. A cluster member started
 * without a model starts the control plane first and loads one when the planner says so. */
static int run_serve(int argc, char **argv)
{
    struct serve_opts o;
    if (parse_opts(argc, argv, &o)) return usage();
    log_set_quiet(!o.verbose && !pid1_active());
    char err[ERRMSG_LEN], name[128];
    static struct serve sv;
    struct scheduler *sched = NULL;
    pthread_t http_thread;
    if (start_front(&sv, &o, &http_thread, err)) {
        front_free(sv.front);
        return 1;
    }
    int rc = 0;
    if (o.model || o.fab.peers.n) {
        rc = bring_up(&sv, &o, &sched, name, sizeof name, err);
        if (!rc) rc = start_control(&sv, &o, sched, name, err);
    } else {
        front_set_progress(sv.front, "empty: waiting for the planner", 0);
        rc = start_control(&sv, &o, NULL, NULL, err);
        if (!rc)
            fprintf(stderr, "strata serve: cluster member without a model: waiting for "
                            "the planner\n");
    }
    if (!rc && sv.cluster) member_loop(&sv, &o, &sched, name, sizeof name);
    pthread_join(http_thread, NULL);
    serve_cluster_stop(sv.cluster);
    serve_free(&sv, &o, sched);
    return rc ? 1 : 0;
}

const struct command cmd_serve = {"serve", run_serve,
                                  "serve -m MODEL.gguf [options]  (the OpenAI-compatible server)"};
