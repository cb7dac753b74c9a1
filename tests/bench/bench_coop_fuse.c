/* A helper's step with a joiner's step fused in (cluster/coop.h), against the two run apart: the
 * engine work alone, no network. The helper decodes OWN rows of its own sequences; the joiner's
 * step brings REM rows that start at layer k. Apart: engine_forward on the own rows, then
 * engine_layers(k, L) + engine_head on the remote rows (the remote layers' weights read a second
 * time). Fused, as coop_fuse.c runs it: the own rows alone through layers [0, k), then all rows through
 * [k, L) one layer at a time, one head. Rows/s of both (own + remote rows per second of engine
 * time, the median of REPS), for k = 3, 6, 9 of the 12 layers of a synthetic stories110M-shape
 * Q8_0 model, 1 thread; and the fused step's logits checked equal to the apart ones, bit for bit.
 * Both with the weights repacked into 16-row groups (a node alone) and in GGUF's layout (a node on
 * the fabric keeps it, to send it on: engine_limits.keep_layout), whose kernel is slower per row.
 * BENCH_FUSE_ROWS=OWN,REM sets the rows (default 4,4), BENCH_FUSE_TYPE=Q4_0 the weights' type,
 * BENCH_THREADS the threads. */
#include "../unit/synth.h"

#include "os/common/errmsg.h"
#include "os/runtime/clock.h"
#include "os/runtime/log.h"
#include "serving/engine/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { REPS = 41, MAXR = 64, POS = 96 };

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct rig {
    struct engine *e;
    int n_own, n_rem, k, L, dim, V;
    int tok[MAXR], pos[MAXR];
    const int *blocks[MAXR];
    int rows[MAXR];
    float *x, *xr, *xin, *la, *lf;
};

/* Apart: the own step, then the remote one. Logits: own rows, then remote rows, in la. */
static int apart(struct rig *r)
{
    struct batch own = {r->n_own, r->tok, r->pos, r->blocks, r->n_own, r->rows};
    int last[MAXR];
    for (int i = 0; i < r->n_rem; i++) last[i] = i;
    struct batch rem = {
        r->n_rem, r->tok + r->n_own, r->pos + r->n_own, r->blocks + r->n_own, r->n_rem, last};
    memcpy(r->xr, r->xin, sizeof(float) * r->n_rem * r->dim);
    return engine_forward(r->e, &own, r->la) || engine_layers(r->e, &rem, r->k, r->L, r->xr) ||
           engine_head(r->e, &rem, r->xr, r->la + (size_t)r->n_own * r->V);
}

/* Fused: own rows through [0, k), then every row one layer at a time, one head, into lf. */
static int fused(struct rig *r)
{
    int n = r->n_own + r->n_rem;
    struct batch own = {r->n_own, r->tok, r->pos, r->blocks, 0, NULL};
    struct batch all = {n, r->tok, r->pos, r->blocks, n, r->rows};
    if (engine_embed(r->e, &own, r->x)) return -1;
    memcpy(r->x + (size_t)r->n_own * r->dim, r->xin, sizeof(float) * r->n_rem * r->dim);
    for (int l = 0; l < r->L; l++) {
        struct batch now = {l < r->k ? r->n_own : n, r->tok, r->pos, r->blocks, 0, NULL};
        if (engine_layers(r->e, &now, l, l + 1, r->x)) return -1;
    }
    return engine_head(r->e, &all, r->x, r->lf);
}

static double median_of(struct rig *r, int (*fn)(struct rig *))
{
    double t[REPS];
    for (int i = 0; i < REPS; i++) {
        double t0 = clock_now();
        if (fn(r)) return -1;
        t[i] = clock_now() - t0;
    }
    qsort(t, REPS, sizeof t[0], cmp_double);
    return t[REPS / 2];
}

/* One model load (repacked, or in GGUF's layout with keep), every k. */
static int run(const char *path, const struct synth_cfg *shape, int keep, int n_own, int n_rem,
               int threads)
{
    char err[ERRMSG_LEN];
    struct loaded_model *lm = calloc(1, sizeof *lm);
    struct loader_opts o = {.limits = {.max_seqs = MAXR,
                                       .max_tokens = MAXR,
                                       .ctx = POS + 2,
                                       .threads = threads,
                                       .keep_layout = keep}};
    if (!lm || loader_open(lm, path, &o, err)) {
        fprintf(stderr, "bench_coop_fuse: %s\n", lm ? err : "out of memory");
        free(lm);
        return 1;
    }
    struct rig r = {.e = &lm->engine,
                    .n_own = n_own,
                    .n_rem = n_rem,
                    .L = shape->layers,
                    .dim = shape->dim,
                    .V = shape->vocab};
    int n = n_own + n_rem, tables[MAXR][8];
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < kv_blocks_for(&r.e->kv, POS + 1); b++)
            tables[i][b] = kv_block_alloc(&r.e->kv);
        r.tok[i] = (i * 977 + 13) % shape->vocab;
        r.pos[i] = POS;
        r.blocks[i] = tables[i];
        r.rows[i] = i;
    }
    r.x = malloc(sizeof(float) * n * shape->dim);
    r.xr = malloc(sizeof(float) * n_rem * shape->dim);
    r.xin = malloc(sizeof(float) * n_rem * shape->dim);
    r.la = malloc(sizeof(float) * n * shape->vocab);
    r.lf = malloc(sizeof(float) * n * shape->vocab);
    printf("bench_coop_fuse: %s (%s), %d thread(s), %d own + %d remote decode rows at position %d; "
           "median of %d steps\n",
           path, keep ? "GGUF layout, as on the fabric" : "repacked", threads, n_own, n_rem, POS,
           REPS);
    for (int k = 3; k <= 9; k += 3) {
        r.k = k;
        /* the joiner's input: the remote rows' states after layers [0, k) */
        struct batch rem = {n_rem, r.tok + n_own, r.pos + n_own, r.blocks + n_own, 0, NULL};
        if (engine_embed(r.e, &rem, r.xin) || engine_layers(r.e, &rem, 0, k, r.xin)) return 1;
        double ta = median_of(&r, apart), tf = median_of(&r, fused);
        if (ta < 0 || tf < 0) return fprintf(stderr, "%s\n", engine_error(r.e)), 1;
        int same = !memcmp(r.la, r.lf, sizeof(float) * n * shape->vocab);
        printf("  k = %d of %d: fused %.0f rows/s (%.2f ms a step) vs apart %.0f rows/s (%.2f ms): "
               "%.2fx; logits %s\n",
               k, shape->layers, n / tf, tf * 1e3, n / ta, ta * 1e3, ta / tf,
               same ? "identical" : "DIFFERENT");
    }
    free(r.x), free(r.xr), free(r.xin), free(r.la), free(r.lf);
    loader_close(lm);
    free(lm);
    return 0;
}

int main(void)
{
    log_set_quiet(1);
    const struct synth_cfg shape = {768, 2048, 12, 12, 12, 32000, 1024}; /* stories110M */
    const char *ty = getenv("BENCH_FUSE_TYPE");
    int q4 = ty && !strcmp(ty, "Q4_0");
    const char *path = q4 ? "build/bench-models/stories110M-Q4_0.gguf"
                          : "build/bench-models/stories110M-Q8_0.gguf";
    int n_own = 4, n_rem = 4, threads = 1;
    const char *rows = getenv("BENCH_FUSE_ROWS"), *th = getenv("BENCH_THREADS");
    if (rows && sscanf(rows, "%d,%d", &n_own, &n_rem) != 2) n_own = 4, n_rem = 4;
    if (th) threads = atoi(th) > 0 ? atoi(th) : 1;
    if (n_own < 1 || n_rem < 1 || n_own + n_rem > MAXR) {
        fprintf(stderr, "bench_coop_fuse: BENCH_FUSE_ROWS=%s: want OWN,REM, 1..%d together\n", rows,
                MAXR);
        return 2;
    }
    struct stat st;
    mkdir("build/bench-models", 0755);
    if (stat(path, &st) != 0 && synth_write(path, &shape, q4 ? GGML_Q4_0 : GGML_Q8_0, 1)) return 1;
    for (int keep = 0; keep <= 1; keep++)
        if (run(path, &shape, keep, n_own, n_rem, threads)) return 1;
    return 0;
}
