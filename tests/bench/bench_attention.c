/* bench_attention: one decode token's attention over the paged KV cache, beside the machine's
 * read bandwidth measured in the same run.
 *
 * For a model shape and a context length P, a cache of enough layers to hold ~256 MiB (8x the
 * last-level cache, so every layer's keys and values come from memory, as in a real decode
 * step where the weights stream through the cache in between) is filled with random values;
 * one pass attends one token at position P-1 over every layer, all query heads, one thread.
 * GB/s = key and value bytes read / time, and the time per layer. Each ISA's kernels run in the
 * same process (the scalar ones are the baseline), over an f32 and an f16 cache (half the bytes:
 * at the same GB/s, twice as fast). Best of several passes (others share this machine).
 * The TinyLlama shape has 8 query heads per kv head: its figure is compute, not the memory.
 * Usage: bench_attention */
#include "os/runtime/arena.h"
#include "os/runtime/clock.h"
#include "os/common/errmsg.h"
#include "serving/engine/fwd_kernels.h"
#include "serving/engine/kv_cache.h"
#include "serving/engine/matmul.h"
#include "tests/bench/membw.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct {
    const char *name;
    int n_heads, n_kv_heads, hd;
} shapes[] = {{"stories110M", 12, 12, 64}, {"tinyllama-1.1B", 32, 4, 64}};

static void run(int s, int ctx, int type, double bw)
{
    char err[ERRMSG_LEN];
    int bs = 16, kvd = shapes[s].n_kv_heads * shapes[s].hd, nb = (ctx + bs - 1) / bs;
    size_t elt = type == KV_F32 ? 4 : 2, per_layer = (size_t)nb * bs * kvd * elt * 2;
    int layers = (int)(((size_t)256 << 20) / per_layer) + 1;
    size_t bytes = kv_cache_bytes(type, layers, kvd, bs, nb);
    /* the engine's arena: 2 MiB pages where it can get them, as the serving cache has (4 KiB
     * pages alone cost a third of the read bandwidth here, in TLB misses) */
    struct arena ar;
    struct kv_cache kv;
    void *mem = NULL;
    if (arena_open(&ar, bytes + (1 << 20), ARENA_NO_LOCK, err) ||
        !(mem = arena_carve(&ar, "kv", bytes, err)) ||
        kv_cache_init(&kv, mem, type, layers, kvd, shapes[s].hd, bs, nb, err)) {
        fprintf(stderr, "bench_attention: %s\n", err);
        if (mem) arena_close(&ar);
        return;
    }
    uint32_t r = 1;
    float *krow = malloc(sizeof(float) * kvd), *vrow = malloc(sizeof(float) * kvd);
    for (int l = 0; l < layers; l++)
        for (int b = 0; b < nb; b++)
            for (int slot = 0; slot < bs; slot++) {
                for (int i = 0; i < kvd; i++) {
                    r = r * 1664525u + 1013904223u;
                    krow[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
                    vrow[i] = (float)(r >> 9) / 8388608.0f - 0.5f;
                }
                fwd_kv_store_scalar(&kv, l, b, slot, krow, vrow);
            }
    free(krow), free(vrow);
    int *table = malloc(sizeof(int) * nb);
    for (int i = 0; i < nb; i++) table[i] = kv_block_alloc(&kv);
    int qd = shapes[s].n_heads * shapes[s].hd;
    float *q = malloc(sizeof(float) * qd), *out = malloc(sizeof(float) * qd);
    float *att = malloc(sizeof(float) * shapes[s].n_heads * fwd_att_floats(ctx));
    for (int i = 0; i < qd; i++) q[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    double read = (double)layers * ctx * kvd * elt * 2;
    printf("%-15s ctx %4d %s:", shapes[s].name, ctx, kv_type_name(type));
    const char *isas[] = {"scalar", "avx2", "avx512"}, *best = matmul_isa();
    int have = !strcmp(best, "avx512") ? 3 : !strcmp(best, "avx2") ? 2 : 1;
    for (int ii = 0; ii < have; ii++) {
        const struct fwd_kernels *fk = fwd_kernels_for(isas[ii]);
        struct attn_args a = {.q = q,
                              .out = out,
                              .att = att,
                              .ctx = ctx,
                              .kv = &kv,
                              .blocks = table,
                              .pos = ctx - 1,
                              .group = shapes[s].n_heads / shapes[s].n_kv_heads,
                              .hd = shapes[s].hd,
                              .scale = 1.0f / sqrtf((float)shapes[s].hd)};
        double best = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = clock_now();
            for (int l = 0; l < layers; l++) {
                a.layer = l;
                fk->attend(&a, 0, shapes[s].n_heads);
            }
            double dt = clock_now() - t0;
            if (dt < best) best = dt;
        }
        printf(" | %s %5.1f GB/s (%3.0f%%) %6.1f us/layer", fk->name, read / best / 1e9,
               100 * read / best / 1e9 / bw, best / layers * 1e6);
    }
    printf("  [read bandwidth %.1f GB/s]\n", bw);
    fflush(stdout);
    free(q), free(out), free(att), free(table);
    arena_close(&ar);
}

int main(void)
{
    double bw = membw_read_gbs(1);
    printf("attention, 1 thread, one token over the cache (keys + values read per second)\n");
    for (int s = 0; s < 2; s++)
        for (int ctx = 128; ctx <= 2048; ctx *= 4)
            for (int type = KV_F32; type <= KV_F16; type++) run(s, ctx, type, bw);
    return 0;
}
