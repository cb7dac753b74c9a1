/* fwd_kernels: attention over the paged cache (f32 and f16) and SwiGLU, every ISA this CPU has,
 * against a double-precision reference; a token's result does not depend on how its heads are
 * split; the f16 cache store rounds exactly as the compiler's _Float16 conversion does; the
 * ggml-fa attention's f16 accumulation. */
#include "os/common/errmsg.h"
#include "check.h"

#include "serving/engine/fwd_kernels.h"
#include "serving/engine/matmul.h"
#include "serving/engine/matmul_kernels.h"

#include <math.h>
#include <stdint.h>

/* This architecture's tables, lowest first (matmul_kernels.h): fwd_kernels_for takes their names. */
#define N_ISAS kernel_tables_n
#define ISA(i) kernel_tables[i]->name

/* 1 if this CPU runs the ISA's kernels: STRATA_ISA naming it gives it (the tables are not
 * nested: a Zen 4 has avx512 but not avxvnni). */
static int have_isa(int i)
{
    char *was = getenv("STRATA_ISA");
    was = was ? strdup(was) : NULL;
    setenv("STRATA_ISA", ISA(i), 1);
    int has = !strcmp(matmul_isa(), ISA(i));
    if (was)
        setenv("STRATA_ISA", was, 1);
    else
        unsetenv("STRATA_ISA");
    free(was);
    return has;
}

/* The float kernels table i's name gives: its own, but AVX-VNNI's, which adds integer dots only
 * and runs AVX2's (fwd_kernels.c). */
static const char *fwd_name(int i)
{
    return strcmp(ISA(i), "avxvnni") ? ISA(i) : "avx2";
}

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* Element i of a cache row, read without the engine's code: f16 through the compiler's
 * _Float16. */
static double elt(const struct kv_cache *kv, const void *row, size_t i)
{
    if (kv->type == KV_F32) return ((const float *)row)[i];
    _Float16 h;
    memcpy(&h, (const uint16_t *)row + i, sizeof h);
    return (double)h;
}

struct fixture {
    struct kv_cache kv;
    void *mem;
    int *table;
    float *q, *out, *att, *ref;
    int n_heads, n_kv_heads, hd, ctx;
};

/* A 2-layer cache of the given element type whose block table runs backwards through the pool
 * (blocks not contiguous), filled with random keys and values (through the scalar store);
 * random queries scaled so the softmax is not flat. */
static void fixture_init(struct fixture *f, int type, int n_heads, int n_kv_heads, int hd, int bs,
                         int ctx)
{
    char err[ERRMSG_LEN];
    int kvd = n_kv_heads * hd, nb = (ctx + bs - 1) / bs + 1;
    f->mem = calloc(1, kv_cache_bytes(type, 2, kvd, bs, nb));
    CHECK(f->mem && kv_cache_init(&f->kv, f->mem, type, 2, kvd, hd, bs, nb, err) == 0);
    f->table = malloc(sizeof(int) * nb);
    for (int i = 0; i < nb; i++) f->table[i] = nb - 1 - i;
    float *k = malloc(sizeof(float) * kvd), *v = malloc(sizeof(float) * kvd);
    for (int l = 0; l < 2; l++)
        for (int b = 0; b < nb; b++)
            for (int slot = 0; slot < bs; slot++) {
                for (int i = 0; i < kvd; i++) k[i] = frand(), v[i] = frand();
                fwd_kv_store_scalar(&f->kv, l, b, slot, k, v);
            }
    free(k), free(v);
    f->q = malloc(sizeof(float) * n_heads * hd);
    f->out = malloc(sizeof(float) * n_heads * hd);
    f->ref = malloc(sizeof(float) * n_heads * hd);
    f->att = malloc(sizeof(float) * n_heads * fwd_att_floats(ctx));
    for (int i = 0; i < n_heads * hd; i++) f->q[i] = 3.0f * frand();
    f->n_heads = n_heads, f->n_kv_heads = n_kv_heads, f->hd = hd, f->ctx = ctx;
}

static void fixture_free(struct fixture *f)
{
    free(f->mem), free(f->table), free(f->q), free(f->out), free(f->ref), free(f->att);
}

static struct attn_args args_for(struct fixture *f, int layer, int pos)
{
    return (struct attn_args){.q = f->q,
                              .out = f->out,
                              .att = f->att,
                              .ctx = f->ctx,
                              .kv = &f->kv,
                              .layer = layer,
                              .blocks = f->table,
                              .pos = pos,
                              .group = f->n_heads / f->n_kv_heads,
                              .hd = f->hd,
                              .scale = 1.0f / sqrtf((float)f->hd)};
}

static void reference(struct fixture *f, int layer, int pos)
{
    const struct kv_cache *kv = &f->kv;
    int hd = f->hd, bs = kv->block_size, group = f->n_heads / f->n_kv_heads;
    double *s = malloc(sizeof(double) * (pos + 1));
    for (int h = 0; h < f->n_heads; h++) {
        size_t off = (size_t)(h / group) * hd;
        double max = -INFINITY, sum = 0;
        for (int p = 0; p <= pos; p++) {
            const void *k = kv_key_block(kv, layer, f->table[p / bs]);
            double d = 0;
            for (int i = 0; i < hd; i++)
                d += (double)f->q[h * hd + i] * elt(kv, k, (off + i) * bs + p % bs);
            s[p] = d / sqrt((double)hd);
            if (s[p] > max) max = s[p];
        }
        for (int p = 0; p <= pos; p++) sum += s[p] = exp(s[p] - max);
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int p = 0; p <= pos; p++)
                o += s[p] / sum *
                     elt(kv, kv_value_at(kv, layer, f->table[p / bs], p % bs, (int)(off + i)), 0);
            f->ref[h * hd + i] = (float)o;
        }
    }
    free(s);
}

/* Head sizes the SIMD tables run in registers (48, 64, 128) and one they hand to the scalar
 * kernel (8); plain heads and GQA groups of 4, 3 and 8 (tiles of 4, 2 and 1 heads); block sizes
 * 16 and 32 (one and several vectors of positions), 8 (AVX-512 hands it to the scalar kernel)
 * and 5 (scalar everywhere); positions at and around block and vector boundaries; f32 and f16
 * caches (the reference reads the same stored halves, so the bound is the kernels' own float
 * error). */
static void attend_matches_reference(int type)
{
    static const int hds[] = {8, 48, 64, 128};
    static const int heads[][2] = {{4, 4}, {8, 2}, {6, 2}, {8, 1}};
    static const int bss[] = {16, 32, 8, 5};
    static const int poss[] = {0, 1, 4, 15, 16, 17, 40, 70};
    int checked = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) {
                struct fixture f;
                fixture_init(&f, type, heads[b][0], heads[b][1], hds[a], bss[c], 71);
                for (int d = 0; d < 8; d++) {
                    int layer = d % 2, pos = poss[d];
                    reference(&f, layer, pos);
                    for (int i = 0; i < N_ISAS; i++) {
                        if (!have_isa(i)) continue;
                        const struct fwd_kernels *fk = fwd_kernels_for(ISA(i));
                        CHECK(!strcmp(fk->name, fwd_name(i)));
                        struct attn_args args = args_for(&f, layer, pos);
                        fk->attend(&args, 0, f.n_heads);
                        double worst = 0;
                        for (int j = 0; j < f.n_heads * f.hd; j++)
                            worst = fmax(worst, fabs((double)f.out[j] - f.ref[j]));
                        CHECKF(worst < 2e-5,
                               "%s, %s cache: hd %d, %d/%d heads, block %d, pos %d: error %.3g",
                               fk->name, kv_type_name(type), f.hd, f.n_heads, f.n_kv_heads, bss[c],
                               pos, worst);
                        checked++;
                    }
                }
                fixture_free(&f);
            }
    CHECK(checked >= 4 * 4 * 4 * 8);
}

TEST(attend_matches_reference_every_isa_f32)
{
    attend_matches_reference(KV_F32);
}

TEST(attend_matches_reference_every_isa_f16)
{
    attend_matches_reference(KV_F16);
}

/* The store on every ISA: a position's keys land in its column of the block (element
 * i * block_size + slot) and its values in its row of each kv head's run (element
 * (g * block_size + slot) * head_dim + d), nothing else changes; f16 elements rounded to nearest
 * even as (_Float16) does, including ties, halves' subnormals, the largest half, overflow to
 * infinity and signed zeros. kv_dim 40 of heads of 8 (AVX-512 stores it with the scalar code)
 * and 48 of heads of 16; block sizes 16 and 3. */
TEST(kv_store_rounds_like_float16)
{
    enum { KVD_MAX = 48 };
    char err[ERRMSG_LEN];
    float k[KVD_MAX], v[KVD_MAX];
    static const float special[] = {0.0f,     -0.0f,       1.0f,      1.00048828125f /* tie */,
                                    65504.0f, 65520.0f,    -7e4f,     6e-8f,
                                    -3e-5f,   2.98e-8f,    1e-10f,    0.099975586f,
                                    1e30f,    -1.0009766f, 1.0014648f /* tie up */};
    int ns = (int)(sizeof special / sizeof *special);
    for (int i = 0; i < KVD_MAX; i++) {
        k[i] = i < ns ? special[i] : 100.0f * frand();
        v[i] = i < ns ? -special[ns - 1 - i] : 100.0f * frand();
    }
    for (int hd = 8; hd <= 16; hd += 8)
        for (int type = KV_F32; type <= KV_F16; type++)
            for (int bs = 16; bs >= 3; bs -= 13) {
                int kvd = hd == 8 ? 40 : 48;
                struct kv_cache kv;
                size_t bytes = kv_cache_bytes(type, 2, kvd, bs, 2);
                uint8_t *mem = malloc(bytes);
                CHECK(mem && kv_cache_init(&kv, mem, type, 2, kvd, hd, bs, 2, err) == 0);
                for (int i = 0; i < N_ISAS; i++) {
                    if (!have_isa(i)) continue;
                    const struct fwd_kernels *fk = fwd_kernels_for(ISA(i));
                    memset(mem, 0xa5, bytes);
                    int slot = bs - 2;
                    fk->kv_store(&kv, 1, 1, slot, k, v);
                    const void *kb = kv_key_block(&kv, 1, 1), *vb = kv_value_block(&kv, 1, 1);
                    for (int j = 0; j < kvd; j++) {
                        double wk = type == KV_F32 ? (double)k[j] : (double)(_Float16)k[j];
                        double wv = type == KV_F32 ? (double)v[j] : (double)(_Float16)v[j];
                        size_t vi = ((size_t)(j / hd) * bs + slot) * hd + j % hd;
                        double gk = elt(&kv, kb, (size_t)j * bs + slot), gv = elt(&kv, vb, vi);
                        CHECKF(gk == wk && signbit(gk) == signbit(wk),
                               "%s, %s cache, hd %d, block %d: key %d: %.9g stored as %.9g, "
                               "want %.9g",
                               fk->name, kv_type_name(type), hd, bs, j, (double)k[j], gk, wk);
                        CHECKF(gv == wv && signbit(gv) == signbit(wv),
                               "%s, %s cache, hd %d, block %d: value %d: %.9g stored as %.9g, "
                               "want %.9g",
                               fk->name, kv_type_name(type), hd, bs, j, (double)v[j], gv, wv);
                    }
                    /* every other byte of the keys and values still 0xa5 */
                    size_t changed = 0, planes = (size_t)((uint8_t *)kv.ref - mem);
                    for (size_t b = 0; b < planes; b++) changed += mem[b] != 0xa5;
                    CHECKF(changed <= 2 * (size_t)kvd * kv.elt,
                           "%s, %s cache, hd %d, block %d: %zu bytes changed, at most %zu",
                           fk->name, kv_type_name(type), hd, bs, changed, 2 * (size_t)kvd * kv.elt);
                }
                free(mem);
            }
}

/* Heads split over calls (as the engine splits them over threads, on kv-head boundaries) give
 * the same bits as one call over all of them. */
TEST(attend_split_heads_bit_identical)
{
    for (int i = 0; i < N_ISAS; i++) {
        if (!have_isa(i)) continue;
        const struct fwd_kernels *fk = fwd_kernels_for(ISA(i));
        struct fixture f;
        fixture_init(&f, KV_F16, 8, 2, 64, 16, 50);
        struct attn_args args = args_for(&f, 1, 37);
        fk->attend(&args, 0, 8);
        float whole[8 * 64];
        memcpy(whole, f.out, sizeof whole);
        memset(f.out, 0, sizeof whole);
        fk->attend(&args, 0, 3); /* mid-group splits: other tiles, the same sums */
        fk->attend(&args, 3, 6);
        fk->attend(&args, 6, 8);
        CHECKF(!memcmp(whole, f.out, sizeof whole), "%s: split heads differ", fk->name);
        fixture_free(&f);
    }
}

/* SwiGLU over a length with a tail past the last whole vector, on inputs from tiny to where
 * exp over- and underflows. */
TEST(swiglu_matches_reference_every_isa)
{
    enum { N = 45 };
    float g0[N], u[N], g[N];
    for (int j = 0; j < N; j++) {
        g0[j] = j < 8 ? (float)((j - 4) * 30) : 12.0f * frand(); /* -120 .. 90, then random */
        u[j] = frand();
    }
    g0[9] = 0.0f, g0[10] = -0.0f, g0[11] = 1e-30f;
    for (int i = 0; i < N_ISAS; i++) {
        if (!have_isa(i)) continue;
        const struct fwd_kernels *fk = fwd_kernels_for(ISA(i));
        memcpy(g, g0, sizeof g);
        fk->swiglu(g, u, N);
        for (int j = 0; j < N; j++) {
            double x = g0[j], want = x / (1.0 + exp(-x)) * u[j];
            CHECKF(fabs(g[j] - want) <= 1e-6 * fabs(want) + 1e-30,
                   "%s: swiglu(%g) * %g = %g, want %g", fk->name, (double)g0[j], (double)u[j],
                   (double)g[j], want);
        }
    }
}

/* The ggml-fa attention (fwd_attn_ggml.c): within f16 accumulation error of the exact reference
 * (and, on an f16 cache over 71 positions, not equal to it: the accumulator is f16); position 0
 * alone gives its value exactly; two positions with equal keys give f16(v0 + v1) * 0.5 exactly,
 * the sum rounded to f16 as llama.cpp's accumulator rounds it. */
TEST(attend_ggml_fa)
{
    for (int type = KV_F32; type <= KV_F16; type++) {
        struct fixture f;
        fixture_init(&f, type, 8, 2, 64, 16, 71);
        double worst = 0;
        for (int pos = 0; pos < 71; pos += 7) {
            reference(&f, pos % 2, pos);
            struct attn_args args = args_for(&f, pos % 2, pos);
            fwd_attend_ggml(&args, 0, f.n_heads);
            for (int j = 0; j < f.n_heads * f.hd; j++)
                worst = fmax(worst, fabs((double)f.out[j] - f.ref[j]));
        }
        if (type == KV_F32)
            CHECKF(worst < 2e-5, "f32 cache: error %.3g", worst);
        else
            CHECKF(worst > 1e-5 && worst < 3e-3, "f16 cache: error %.3g", worst);
        struct attn_args args = args_for(&f, 0, 0);
        fwd_attend_ggml(&args, 0, f.n_heads);
        for (int h = 0; h < f.n_heads; h++)
            for (int i = 0; i < f.hd; i++) {
                const void *v = kv_value_at(&f.kv, 0, f.table[0], 0, (h / 4) * f.hd + i);
                CHECK(f.out[h * f.hd + i] == (float)elt(&f.kv, v, 0));
            }
        /* position 1 gets position 0's keys (its values stay) */
        int kvd = f.n_kv_heads * f.hd, rounded = 0;
        float *k = malloc(sizeof(float) * kvd), *v = malloc(sizeof(float) * kvd);
        for (int i = 0; i < kvd; i++) {
            const void *kb = kv_key_block(&f.kv, 0, f.table[0]);
            k[i] = (float)elt(&f.kv, kb, (size_t)i * f.kv.block_size);
            v[i] = (float)elt(&f.kv, kv_value_at(&f.kv, 0, f.table[0], 1, i), 0);
        }
        fwd_kv_store_scalar(&f.kv, 0, f.table[0], 1, k, v);
        args = args_for(&f, 0, 1);
        fwd_attend_ggml(&args, 0, f.n_heads);
        for (int h = 0; h < f.n_heads; h++)
            for (int i = 0; i < f.hd; i++) {
                int c = (h / 4) * f.hd + i;
                float v0 = (float)elt(&f.kv, kv_value_at(&f.kv, 0, f.table[0], 0, c), 0);
                float v1 = (float)elt(&f.kv, kv_value_at(&f.kv, 0, f.table[0], 1, c), 0);
                float sum = v0 + v1;
                if (type == KV_F16) {
                    _Float16 r = (_Float16)sum;
                    rounded += (float)r != sum;
                    sum = (float)r;
                }
                CHECKF(f.out[h * f.hd + i] == sum * 0.5f, "%s cache, head %d, %d: %.9g, want %.9g",
                       kv_type_name(type), h, i, f.out[h * f.hd + i], sum * 0.5f);
            }
        CHECK(type == KV_F32 || rounded > 0);
        free(k), free(v);
        fixture_free(&f);
    }
}

int main(void)
{
    printf("# best ISA on this CPU: %s\n", matmul_isa());
    RUN(attend_matches_reference_every_isa_f32);
    RUN(attend_matches_reference_every_isa_f16);
    RUN(kv_store_rounds_like_float16);
    RUN(attend_split_heads_bit_identical);
    RUN(swiglu_matches_reference_every_isa);
    RUN(attend_ggml_fa);
    CHECK_DONE();
}
