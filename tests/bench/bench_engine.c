/* Model benchmark: synthetic models of the stories15M, stories110M and TinyLlama-1.1B shapes in
 * F32, Q8_0 and Q4_0, at 1 and 2 threads: prefill tokens/s (a 64-token prompt in one batch) and
 * batch-1 decode tokens/s, beside the machine's read bandwidth (the median of passes interleaved
 * with the decoded tokens; the first line has the best pass of a separate run) and the
 * bandwidth each decode implies (weight bytes read per token x tokens/s).
 * Models are written once to build/bench-models/ and reused.
 * BENCH_SHAPES=stories15M,stories110M,tinyllama-1.1B limits the shapes, BENCH_TYPES=Q8_0,Q4_0
 * the types, BENCH_THREADS=1 or 2 the thread counts. */
#include "../unit/synth.h"

#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "os/runtime/log.h"
#include "serving/engine/loader.h"
#include "tests/bench/membw.h"
#include "serving/engine/sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct shape {
    const char *name;
    struct synth_cfg c;
};

static const struct shape shapes[] = {
    {"stories15M", {288, 768, 6, 6, 6, 32000, 256}},
    {"stories110M", {768, 2048, 12, 12, 12, 32000, 1024}},
    {"tinyllama-1.1B", {2048, 5632, 22, 32, 4, 32000, 2048}},
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run(const struct shape *s, uint32_t type, int threads, double bw)
{
    char path[256], err[ERRMSG_LEN];
    mkdir("build/bench-models", 0755);
    snprintf(path, sizeof path, "build/bench-models/%s-%s.gguf", s->name, ggml_type_name(type));
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "writing %s ...\n", path);
        if (synth_write(path, &s->c, type, 1)) return;
    }
    struct loaded_model *lm = calloc(1, sizeof *lm);
    int n_prompt = 64, n_decode = 32;
    struct loader_opts o = {.limits = {.max_seqs = 1,
                                       .max_tokens = n_prompt,
                                       .ctx = n_prompt + n_decode + 1,
                                       .threads = threads}};
    if (loader_open(lm, path, &o, err)) {
        fprintf(stderr, "%s\n", err);
        free(lm);
        return;
    }
    struct engine *e = &lm->engine;
    int V = lm->model.cfg.vocab_size;
    int toks[64], pos[64], table[64], last = n_prompt - 1;
    const int *blocks[64];
    for (int i = 0; i < kv_blocks_for(&e->kv, e->lim.ctx); i++) table[i] = kv_block_alloc(&e->kv);
    for (int i = 0; i < n_prompt; i++)
        toks[i] = 3 + (i * 7919) % (V - 3), pos[i] = i, blocks[i] = table;
    float *logits = malloc(sizeof(float) * V);
    struct batch b = {n_prompt, toks, pos, blocks, 1, &last};
    double t0 = clock_now();
    engine_forward(e, &b, logits);
    double t1 = clock_now();
    int cur = n_prompt, tok = sampler_argmax(logits, V);
    /* A bandwidth pass before every 4th token: the decode and the limit it is compared with are
     * measured at the same moments (on a shared host, others' load moves both). */
    struct membw *probe = membw_open(threads, (size_t)256 << 20);
    double dt[64], bwp[16];
    int n_bw = 0;
    for (int i = 0; i < n_decode; i++) {
        if (probe && i % 4 == 0) bwp[n_bw++] = membw_pass(probe);
        int z = 0, p = cur++;
        const int *bt = table;
        struct batch d = {1, &tok, &p, &bt, 1, &z};
        double ta = clock_now();
        engine_forward(e, &d, logits);
        tok = sampler_argmax(logits, V);
        dt[i] = clock_now() - ta;
    }
    /* Decode speed from the median token time: others share this machine, and the median
     * ignores the tokens that were descheduled. */
    qsort(dt, (size_t)n_decode, sizeof dt[0], cmp_double);
    membw_close(probe);
    if (n_bw) {
        qsort(bwp, (size_t)n_bw, sizeof bwp[0], cmp_double);
        bw = bwp[n_bw / 2];
    }
    double t2 = t1 + n_decode * dt[n_decode / 2];
    /* Every weight is read once per decoded token, except the embedding table, of which one row
     * is read (unless the output is tied to it). */
    double bytes = (double)lm->model.image_size;
    if (!lm->model.tied_output) bytes -= (double)lm->model.token_embd.nbytes;
    double dec = n_decode / (t2 - t1), gbs = bytes * dec / 1e9;
    printf("%-15s %-5s %d thr | prefill %8.1f tok/s | decode %7.2f tok/s = %6.1f GB/s "
           "(%3.0f%% of %.1f GB/s read meanwhile) | %s\n",
           s->name, ggml_type_name(type), threads, n_prompt / (t1 - t0), dec, gbs, 100 * gbs / bw,
           bw, matmul_isa());
    fflush(stdout);
    free(logits);
    loader_close(lm);
    free(lm);
}

int main(void)
{
    log_set_quiet(1);
    const char *only = getenv("BENCH_SHAPES"), *only_types = getenv("BENCH_TYPES");
    const char *only_threads = getenv("BENCH_THREADS");
    uint32_t types[] = {GGML_F32, GGML_Q8_0, GGML_Q4_0};
    double bw[3] = {0, membw_read_gbs(1), membw_read_gbs(2)};
    printf("memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n", bw[1], bw[2]);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        if (only && !strstr(only, shapes[s].name)) continue;
        for (size_t t = 0; t < 3; t++) {
            if (only_types && !strcasestr(only_types, ggml_type_name(types[t]))) continue;
            for (int th = 1; th <= 2; th++)
                if (!only_threads || atoi(only_threads) == th)
                    run(&shapes[s], types[t], th, bw[th]);
        }
    }
    return 0;
}
