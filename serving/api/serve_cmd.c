/* strata serve: the OpenAI-compatible server.
 *
 * Order of start-up: PID-1 duties (os/pid1), the HTTP front (so /health answers 503 with the load
 * progress at once), the model (loader), the scheduler (calibrated step-time model, then its
 * compute thread), then completions are served. SIGTERM/SIGINT (or the power button as PID 1)
 * stop the front; running requests are ended and the process exits 0. */
#include "cluster/serve_cluster.h"
#include "os/errmsg.h"
#include "os/log.h"
#include "os/pid1.h"
#include "serving/api/http_server.h"
#include "serving/api/scheduler.h"
#include "serving/api/serve_front.h"
#include "serving/commands.h"
#include "serving/engine/loader.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct serve_opts {
    const char *model, *host, *api_key, *name;
    int port, max_batch, ctx, threads, step_tokens, kv_blocks, kv_block_size, kv_type, static_batch;
    int max_conns, timeout_ms, idle_timeout_ms, no_slo, verbose, step_delay_us, shed_late,
        static_shrink;
    double ttft_ms, tpot_ms, static_wait_ms;
    long max_body;
    struct control_cfg cluster; /* --cluster and friends (cluster/control.h) */
};

static int usage(void)
{
    fprintf(stderr,
            "usage: strata serve -m MODEL.gguf [--host ADDR] [--port N] [--api-key KEY]\n"
            "         [--max-batch N] [--ctx N] [--threads N] [--step-tokens N]\n"
            "         [--ttft-ms MS] [--tpot-ms MS] [--no-slo] [--shed-late] [--static-batch N]\n"
            "         [--static-wait-ms MS] [--static-shrink] [--kv-blocks N] [--kv-block-size N]\n"
            "         [--kv-type f16|f32]\n"
            "         [--max-conns N] [--max-body BYTES] [--timeout-ms MS] [--name ID] [-v]\n"
            "         [--test-step-delay-us US]  (tests: sleep after every step)\n"
            "         [--cluster ID@HOST:PORT,... --node-id N --key-file K [--cluster-addr A]\n"
            "          [--raft-dir DIR] [--cluster-heartbeat-ms MS] [--cluster-dead-ms MS]\n"
            "          [--keep-alive-ms MS] [--replicas-cached R] [--gpu-type T] "
            "[--cluster-standby]]\n");
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
                             .ttft_ms = 1000,
                             .tpot_ms = 100,
                             .static_wait_ms = 50,
                             .max_body = 1 << 20};
    o->api_key = getenv("STRATA_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const struct {
            const char *flag;
            int *ip;
            double *dp;
            long lo, hi;
        } nums[] = {
            {"--port", &o->port, NULL, 0, 65535},
            {"--max-batch", &o->max_batch, NULL, 1, 4096},
            {"--ctx", &o->ctx, NULL, 0, 1 << 20},
            {"--threads", &o->threads, NULL, 0, 1024},
            {"--step-tokens", &o->step_tokens, NULL, 1, 65536},
            {"--kv-blocks", &o->kv_blocks, NULL, 0, 1 << 24},
            {"--kv-block-size", &o->kv_block_size, NULL, 1, 4096},
            {"--static-batch", &o->static_batch, NULL, 0, 4096},
            {"--test-step-delay-us", &o->step_delay_us, NULL, 0, 1000000},
            {"--max-conns", &o->max_conns, NULL, 1, 1 << 20},
            {"--timeout-ms", &o->timeout_ms, NULL, 1, 3600000},
            {"--idle-timeout-ms", &o->idle_timeout_ms, NULL, 1, 3600000},
            {"--ttft-ms", NULL, &o->ttft_ms, 1, 3600000},
            {"--tpot-ms", NULL, &o->tpot_ms, 1, 3600000},
            {"--static-wait-ms", NULL, &o->static_wait_ms, 0, 3600000},
        };
        int done = 0;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !done; k++) {
            if (strcmp(a, nums[k].flag)) continue;
            char *end;
            double d = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || d < nums[k].lo || d > nums[k].hi) {
                fprintf(stderr, "strata serve: %s wants a number in [%ld, %ld]\n", a, nums[k].lo,
                        nums[k].hi);
                return -1;
            }
            if (nums[k].ip)
                *nums[k].ip = (int)d;
            else
                *nums[k].dp = d;
            i++;
            done = 1;
        }
        if (done) continue;
        int cl = control_opt(&o->cluster, a, v);
        if (cl < 0) return -1;
        if (cl) {
            i += cl - 1;
            continue;
        }
        if (!strcmp(a, "-m") && v)
            o->model = v, i++;
        else if (!strcmp(a, "--host") && v)
            o->host = v, i++;
        else if (!strcmp(a, "--kv-type") && v) {
            if ((o->kv_type = kv_type_parse(v)) == KV_DEFAULT) {
                fprintf(stderr, "strata serve: --kv-type %s: want f16 or f32\n", v);
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--api-key") && v)
            o->api_key = v, i++;
        else if (!strcmp(a, "--name") && v)
            o->name = v, i++;
        else if (!strcmp(a, "--max-body") && v)
            o->max_body = atol(v), i++;
        else if (!strcmp(a, "--shed-late"))
            o->shed_late = 1;
        else if (!strcmp(a, "--static-shrink"))
            o->static_shrink = 1;
        else if (!strcmp(a, "--no-slo"))
            o->no_slo = 1;
        else if (!strcmp(a, "-v"))
            o->verbose = 1;
        else {
            fprintf(stderr, "strata serve: unknown or incomplete option '%s'\n", a);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "strata serve: -m MODEL.gguf is required\n");
        return -1;
    }
    if (o->max_body < 1024) o->max_body = 1024;
    return 0;
}

/* ---------------------------------------------------------------- glue to the engine */

struct serve {
    struct loaded_model *lm;
    struct http_server *http;
    struct front *front;
    struct serve_metrics metrics;
};

static int engine_step(void *ctx, const struct batch *b, float *logits)
{
    return engine_forward(ctx, b, logits);
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

static void on_signal(int sig)
{
    (void)sig;
    if (stop_target) http_server_shutdown(stop_target, SHUTDOWN_GRACE_MS);
}

static void on_shutdown(void *ctx)
{
    http_server_shutdown(ctx, SHUTDOWN_GRACE_MS);
}

static void *http_main(void *arg)
{
    struct serve *sv = arg;
    char err[ERRMSG_LEN];
    if (http_server_run(sv->http, err)) log_error("serve", "%s", err);
    return NULL;
}

static const char *model_name(const struct serve_opts *o, char *buf, size_t n)
{
    if (o->name) return o->name;
    const char *base = strrchr(o->model, '/');
    base = base ? base + 1 : o->model;
    snprintf(buf, n, "%s", base);
    char *dot = strstr(buf, ".gguf");
    if (dot) *dot = 0;
    return buf;
}

int cmd_serve(int argc, char **argv)
{
    struct serve_opts o;
    if (parse_opts(argc, argv, &o)) return usage();
    log_set_quiet(!o.verbose && !pid1_active());
    char err[ERRMSG_LEN];
    static struct serve sv;
    metrics_init(&sv.metrics);
    struct front_config fc = {.api_key = o.api_key};
    sv.front = front_new(&fc, &sv.metrics, err);
    if (!sv.front) pid1_fatal(err);
    struct http_server_config hc = {.host = o.host,
                                    .port = o.port,
                                    .max_conns = o.max_conns,
                                    .max_head = 16384,
                                    .max_body = (size_t)o.max_body,
                                    .read_timeout_ms = o.timeout_ms,
                                    .idle_timeout_ms = o.idle_timeout_ms,
                                    .write_timeout_ms = o.timeout_ms,
                                    .max_pending_write = 8u << 20};
    struct http_handler h = front_handler(sv.front);
    sv.http = http_server_new(&hc, &h, &sv.metrics, err);
    if (!sv.http) {
        char msg[ERRMSG_LEN + 32];
        snprintf(msg, sizeof msg, "serve: %s", err);
        if (pid1_active()) pid1_fatal(msg);
        fprintf(stderr, "strata %s\n", msg);
        front_free(sv.front);
        return 1;
    }
    front_set_server(sv.front, sv.http);
    /* PID 1 duties before any thread exists; elsewhere plain signal handlers. */
    if (pid1_init(on_shutdown, sv.http, err)) pid1_fatal(err);
    signal(SIGPIPE, SIG_IGN);
    if (!pid1_active()) {
        stop_target = sv.http;
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    }
    pthread_t http_thread;
    if (pthread_create(&http_thread, NULL, http_main, &sv)) pid1_fatal("serve: pthread_create");
    fprintf(stderr, "strata serve: listening on %s:%d, loading %s\n", o.host,
            http_server_port(sv.http), o.model);

    int rc = 1;
    struct scheduler *sched = NULL;
    sv.lm = calloc(1, sizeof *sv.lm);
    struct loader_opts lo = {.limits = {.max_tokens = o.step_tokens,
                                        .max_seqs = o.static_batch ? o.static_batch : o.max_batch,
                                        .ctx = o.ctx,
                                        .kv_block_size = o.kv_block_size,
                                        .kv_blocks = o.kv_blocks,
                                        .kv_type = o.kv_type,
                                        .threads = o.threads},
                             .arena_flags = pid1_active() ? 0 : ARENA_NO_LOCK,
                             .verbose = o.verbose,
                             .progress = on_progress,
                             .progress_ctx = &sv};
    if (!sv.lm || loader_open(sv.lm, o.model, &lo, err)) {
        char msg[ERRMSG_LEN + 32];
        snprintf(msg, sizeof msg, "serve: %s", sv.lm ? err : "out of memory");
        if (pid1_active()) pid1_fatal(msg);
        fprintf(stderr, "strata %s\n", msg);
        free(sv.lm);
        sv.lm = NULL;
        http_server_stop(sv.http);
        goto out;
    }
    struct engine *e = &sv.lm->engine;
    front_set_progress(sv.front, "calibrating the step-time model", 0.95);
    struct sched_config sc = {.max_seqs = e->lim.max_seqs,
                              .max_step_tokens = e->lim.max_tokens,
                              .ctx = e->lim.ctx,
                              .static_batch = o.static_batch,
                              .static_wait_ms = o.static_wait_ms,
                              .ttft_ms = o.ttft_ms,
                              .tpot_ms = o.tpot_ms,
                              .no_slo_admission = o.no_slo,
                              .shed_late = o.shed_late,
                              .static_shrink = o.static_shrink,
                              .step_delay_us = o.step_delay_us};
    struct sched_ops ops = {.ctx = e,
                            .vocab_size = sv.lm->model.cfg.vocab_size,
                            .eos_id = sv.lm->tok.eos_id,
                            .alt_eos_id = sv.lm->tok.bos_id,
                            .forward = engine_step,
                            .decode_ctx = &sv.lm->tok,
                            .decode = decode_piece,
                            .notify_ctx = sv.front,
                            .notify = front_notify,
                            .wake = front_wake};
    sched = sched_new(&sc, &ops, &e->kv, &sv.metrics, err);
    if (!sched || sched_calibrate(sched, err) || sched_start(sched, err)) {
        char msg[ERRMSG_LEN + 32];
        snprintf(msg, sizeof msg, "serve: %s", err);
        if (pid1_active()) pid1_fatal(msg);
        fprintf(stderr, "strata %s\n", msg);
        http_server_stop(sv.http);
        goto out;
    }
    const struct step_model *sm = sched_step_model(sched);
    log_info("serve", "step model: %.1f us/token + %.1f us/sequence + %.1f us", sm->a * 1e6,
             sm->b * 1e6, sm->c * 1e6);
    struct gguf_str tmpl = {0};
    gguf_get_str(&sv.lm->gguf, "tokenizer.chat_template", &tmpl, NULL);
    char name_buf[128];
    struct front_model fm = {.name = model_name(&o, name_buf, sizeof name_buf),
                             .ctx = e->lim.ctx,
                             .vocab_size = sv.lm->model.cfg.vocab_size,
                             .tmpl = chat_template_detect(tmpl.p, tmpl.len),
                             .tok = &sv.lm->tok,
                             .encode = encode_text,
                             .encode_chat = encode_chat};
    front_set_ready(sv.front, &fm, sched);
    fprintf(stderr,
            "strata serve: ready: %s on %s:%d (ctx %d, max batch %d, %d tokens/step, %d %s KV "
            "blocks of %d, chat template %s%s)\n",
            fm.name, o.host, http_server_port(sv.http), e->lim.ctx, e->lim.max_seqs,
            e->lim.max_tokens, e->kv.n_blocks, kv_type_name(e->kv.type), e->kv.block_size,
            chat_template_name(fm.tmpl), o.static_batch ? ", STATIC batching" : "");
    rc = 0;
    /* ---- the cluster's control thread (cluster/serve_cluster.h), with --cluster only */
    struct serve_cluster *cluster = NULL;
    if (control_enabled(&o.cluster)) {
        char http_addr[80];
        snprintf(http_addr, sizeof http_addr, "%s:%d", o.host, http_server_port(sv.http));
        o.cluster.http = http_addr;
        o.cluster.model = fm.name;
        o.cluster.n_layers = sv.lm->model.cfg.n_layers;
        o.cluster.ttft_slo_ms = o.ttft_ms;
        cluster =
            serve_cluster_start(&o.cluster, sv.front, &sv.metrics, sched, e->lim.max_tokens, err);
        if (!cluster) {
            char msg[ERRMSG_LEN + 32];
            snprintf(msg, sizeof msg, "serve: %s", err);
            if (pid1_active()) pid1_fatal(msg);
            fprintf(stderr, "strata %s\n", msg);
            http_server_stop(sv.http);
            rc = 1;
        }
    }
    pthread_join(http_thread, NULL);
    serve_cluster_stop(cluster);
    goto done;
out:
    pthread_join(http_thread, NULL);
done:
    if (sched) sched_free(sched);
    fprintf(stderr, "strata serve: stopped\n");
    http_server_free(sv.http);
    front_free(sv.front);
    if (sv.lm) {
        loader_close(sv.lm);
        free(sv.lm);
    }
    return rc;
}
