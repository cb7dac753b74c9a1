/* A node that pulled its weights over the fabric, at k = L, beside a node that loaded the file:
 * prefill tokens/s (a 64-token prompt in one batch) and batch-1 decode tokens/s (the median token
 * of 32), in one process, same threads, the engines measured in turn, round after round (the
 * median of ROUNDS rounds: others share this host). Three engines of the same synthetic model:
 *   file     loader_open without keep_layout (repacked at init: a node alone);
 *   joiner   streamed over loopback TCP from a source (which repacked after taking its CRCs),
 *            each span repacked as it landed (cluster/stream_loader.h);
 *   gguf     streamed the same way with keep_gguf: GGUF's row layout, what a joiner ran before
 *            (and what one still runs over rdma).
 * The joiner's weight image (byte for byte: the same records), decoded tokens and logits are
 * checked equal to the file-loaded node's, so what differs between the two is the host's noise.
 * Models are written once to build/bench-models/ (bench_engine's names) and reused.
 * BENCH_SHAPES=stories110M,tinyllama-1.1B the shapes (default stories110M), BENCH_TYPES=Q4_0,
 * Q8_0,Q4_K the types (default all three), BENCH_THREADS=1 or 2 the threads (default both). */
#include "../unit/free_port.h"
#include "../unit/synth.h"

#include "cluster/stream_loader.h"
#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "serving/engine/sampler.h"
#include "transport/auth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { ROUNDS = 5, N_PROMPT = 64, N_DECODE = 32 };

struct shape {
    const char *name;
    struct synth_cfg c;
};

static const struct shape shapes[] = {
    {"stories110M", {768, 2048, 12, 12, 12, 32000, 1024}},
    {"tinyllama-1.1B", {2048, 5632, 22, 32, 4, 32000, 2048}},
};

static char err[ERRMSG_LEN];

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* One round on one engine: the prompt (timed), then N_DECODE greedy tokens (each timed). */
struct run {
    double prefill_s, token_s;
    int tokens[N_DECODE];
    float *logits; /* the last token's */
};

static int measure(struct loaded_model *lm, struct run *r)
{
    struct engine *e = &lm->engine;
    int V = lm->model.cfg.vocab_size, nb = kv_blocks_for(&e->kv, e->lim.ctx);
    int toks[N_PROMPT], pos[N_PROMPT], table[64], last = N_PROMPT - 1, rc = -1;
    const int *blocks[N_PROMPT];
    for (int i = 0; i < nb; i++) table[i] = kv_block_alloc(&e->kv);
    for (int i = 0; i < N_PROMPT; i++)
        toks[i] = 3 + (i * 7919) % (V - 3), pos[i] = i, blocks[i] = table;
    struct batch b = {N_PROMPT, toks, pos, blocks, 1, &last};
    double t0 = clock_now(), dt[N_DECODE];
    if (engine_forward(e, &b, r->logits)) goto out;
    r->prefill_s = clock_now() - t0;
    int tok = sampler_argmax(r->logits, V);
    for (int i = 0; i < N_DECODE; i++) {
        int z = 0, p = N_PROMPT + i;
        const int *bt = table;
        struct batch d = {1, &tok, &p, &bt, 1, &z};
        double ta = clock_now();
        if (engine_forward(e, &d, r->logits)) goto out;
        dt[i] = clock_now() - ta;
        r->tokens[i] = tok = sampler_argmax(r->logits, V);
    }
    r->token_s = median(dt, N_DECODE);
    rc = 0;
out:
    for (int i = 0; i < nb; i++) kv_block_free(&e->kv, table[i]);
    return rc;
}

static struct tp *tp_at(const char *listen)
{
    struct tp_config c = {.kind = "tcp", .listen = listen};
    memset(c.key.k, 7, 32);
    return tp_open(&c, err);
}

/* source -> two joiners (one repacking as spans land, one keeping GGUF's layout), to the end. */
static int stream_two(const char *path, const struct loader_opts *o, struct loaded_model *jr,
                      struct loaded_model *jg, double *secs, double *repack_s, double *span_max,
                      double *read_gbs)
{
    static struct loaded_model src_lm;
    static struct stream_loader src, sr, sg;
    int rc = -1;
    if (loader_open(&src_lm, path, o, err)) return -1;
    if (stream_loader_source(&src, &src_lm, "bench", 0, NULL, err) ||
        stream_loader_repack(&src, err))
        goto close_src;
    stream_loader_joiner(&sr, jr, o, NULL);
    stream_loader_joiner(&sg, jg, o, NULL);
    sg.keep_gguf = 1;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    const char *peers[1] = {addr};
    struct tp *ts = tp_at(addr), *t1 = tp_at(NULL), *t2 = tp_at(NULL);
    struct weight_stream *ws = NULL, *w1 = NULL, *w2 = NULL;
    if (!ts || !t1 || !t2) goto close_tp;
    struct weight_stream_config cs = {.t = ts, .store = &src.store, .corrupt_unit = -1},
                                c1 = {.t = t1,
                                      .store = &sr.store,
                                      .peers = peers,
                                      .n_peers = 1,
                                      .corrupt_unit = -1},
                                c2 = c1;
    c2.t = t2;
    c2.store = &sg.store;
    if (!(ws = weight_stream_new(&cs, err)) || !(w1 = weight_stream_new(&c1, err)) ||
        !(w2 = weight_stream_new(&c2, err)))
        goto close_tp;
    double t0 = clock_now();
    while (!(weight_stream_finished(w1) && weight_stream_finished(w2))) {
        if (clock_now() - t0 > 600) {
            errmsg_set(err, "the stream did not finish in 600 s");
            goto close_tp;
        }
        tp_poll(ts, 0);
        tp_poll(t1, 0);
        tp_poll(t2, 1);
        if (weight_stream_step(ws, err) || weight_stream_step(w1, err) ||
            weight_stream_step(w2, err))
            goto close_tp;
    }
    *secs = clock_now() - t0;
    /* what a holder's send path costs: its whole image back in GGUF's bytes, 1 MiB at a time */
    size_t size = (size_t)src_lm.model.image_size, step = (size_t)1 << 20;
    uint8_t *buf = malloc(step);
    double tr = clock_now();
    for (size_t off = 0; buf && off < size; off += step)
        engine_read_gguf(&src_lm.engine, src_lm.weights, off, size - off < step ? size - off : step,
                         buf);
    *read_gbs = buf ? size / (clock_now() - tr) / 1e9 : 0;
    free(buf);
    *repack_s = sr.repack_s;
    *span_max = sr.repack_max_s;
    rc = 0;
close_tp:
    weight_stream_free(ws), weight_stream_free(w1), weight_stream_free(w2);
    if (ts) tp_destroy(ts);
    if (t1) tp_destroy(t1);
    if (t2) tp_destroy(t2);
    stream_loader_free(&sr), stream_loader_free(&sg);
close_src:
    stream_loader_free(&src);
    loader_close(&src_lm);
    return rc;
}

static void bench(const struct shape *s, uint32_t type, int threads)
{
    char path[256];
    mkdir("build/bench-models", 0755);
    snprintf(path, sizeof path, "build/bench-models/%s-%s.gguf", s->name, ggml_type_name(type));
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "writing %s ...\n", path);
        if (synth_write(path, &s->c, type, 1)) return;
    }
    struct loader_opts o = {.limits = {.max_seqs = 1,
                                       .max_tokens = N_PROMPT,
                                       .ctx = N_PROMPT + N_DECODE + 1,
                                       .threads = threads,
                                       .keep_layout = 1}},
                       of = o;
    of.limits.keep_layout = 0;
    static struct loaded_model lm[3]; /* file, joiner, gguf */
    memset(lm, 0, sizeof lm);
    double stream_s = 0, repack_s = 0, span_max = 0, read_gbs = 0;
    if (loader_open(&lm[0], path, &of, err) ||
        stream_two(path, &o, &lm[1], &lm[2], &stream_s, &repack_s, &span_max, &read_gbs)) {
        fprintf(stderr, "%s %s: %s\n", s->name, ggml_type_name(type), err);
        for (int i = 0; i < 3; i++)
            if (lm[i].engine_started) loader_close(&lm[i]);
        return;
    }
    int V = lm[0].model.cfg.vocab_size,
        same = !memcmp(lm[0].weights, lm[1].weights, lm[0].model.image_size);
    double pre[3][ROUNDS], dec[3][ROUNDS];
    struct run r[3];
    for (int i = 0; i < 3; i++) r[i].logits = malloc(sizeof(float) * V);
    for (int round = 0; round < ROUNDS; round++)
        for (int i = 0; i < 3; i++) {
            if (measure(&lm[i], &r[i])) {
                fprintf(stderr, "%s\n", engine_error(&lm[i].engine));
                goto out;
            }
            pre[i][round] = N_PROMPT / r[i].prefill_s;
            dec[i][round] = 1 / r[i].token_s;
            if (i == 1)
                same &= !memcmp(r[0].tokens, r[1].tokens, sizeof r[0].tokens) &&
                        !memcmp(r[0].logits, r[1].logits, sizeof(float) * V);
        }
    double p[3], d[3];
    for (int i = 0; i < 3; i++) p[i] = median(pre[i], ROUNDS), d[i] = median(dec[i], ROUNDS);
    printf("%-14s %-4s %d thr | file-loaded: prefill %7.1f, decode %6.2f tok/s | joiner at k = L: "
           "prefill %7.1f (%.2fx), decode %6.2f (%.2fx) | in GGUF's layout: prefill %7.1f, decode "
           "%6.2f | %s; streamed in %.1f s, repacked as it landed in %.2f s (one span at most %.3f "
           "s); a holder reads GGUF's bytes back at %.1f GB/s | %s\n",
           s->name, ggml_type_name(type), threads, p[0], d[0], p[1], p[1] / p[0], d[1], d[1] / d[0],
           p[2], d[2], same ? "image, tokens, logits identical" : "IMAGE OR OUTPUT DIFFERS",
           stream_s, repack_s, span_max, read_gbs, matmul_isa());
    fflush(stdout);
out:
    for (int i = 0; i < 3; i++) free(r[i].logits), loader_close(&lm[i]);
}

int main(void)
{
    log_set_quiet(1);
    if (auth_init(err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const char *only = getenv("BENCH_SHAPES"), *only_types = getenv("BENCH_TYPES");
    const char *only_threads = getenv("BENCH_THREADS");
    uint32_t types[] = {GGML_Q4_0, GGML_Q8_0, GGML_Q4_K};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        if (only ? !strstr(only, shapes[s].name) : s > 0) continue;
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            if (only_types && !strcasestr(only_types, ggml_type_name(types[t]))) continue;
            for (int th = 1; th <= 2; th++)
                if (!only_threads || atoi(only_threads) == th) bench(&shapes[s], types[t], th);
        }
    }
    return 0;
}
