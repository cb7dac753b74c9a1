/* matmul and threadpool: every weight type and layout (repack.h's 16-row groups too) x every ISA
 * this CPU has x n_tok in {1,2,3,5,17} x odd row counts (multiples of 16 for the groups),
 * against a double-precision reference on the dequantized weights; every ISA against the scalar
 * kernels; results independent of batch size, tiling and thread count. */
#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/matmul.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"
#include "serving/engine/threadpool.h"
#include "tests/unit/check.h"

#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((int32_t)(rng >> 32)) / 2147483648.0f;
}

static const uint32_t types[] = {
    GGML_F32,        GGML_F16,         GGML_BF16,         GGML_Q8_0,       GGML_Q4_0,
    GGML_Q4_K,       TENSOR_Q8_0_X16,  TENSOR_Q4_0_X16,   GGML_Q4_1,       GGML_Q5_0,
    GGML_Q5_1,       GGML_IQ4_NL,      GGML_Q2_K,         GGML_Q3_K,       GGML_Q5_K,
    GGML_Q6_K,       GGML_IQ4_XS,      TENSOR_Q4_K_X16,   TENSOR_Q6_K_X16, TENSOR_Q5_K_X16,
    TENSOR_Q2_K_X16, TENSOR_Q3_K_X16,  TENSOR_IQ4_XS_X16, TENSOR_Q4_1_X16, TENSOR_Q5_0_X16,
    TENSOR_Q5_1_X16, TENSOR_IQ4_NL_X16};

/* Float types get a column count that is not a multiple of the vector width (tail path); the
 * block types an odd number of blocks. */
static int cols_for(uint32_t t)
{
    int blk = ggml_block_elems(repack_base_type(t));
    return blk == 256 ? 768 : blk == 32 ? 288 : 200;
}

static size_t row_size(uint32_t t, int cols)
{
    return (size_t)ggml_row_bytes(repack_base_type(t), (uint64_t)cols);
}

struct mat {
    struct tensor t;
    uint8_t *data;
    float *deq; /* dequantized weights, rows x cols */
};

/* type may be a repacked layout: the rows are quantized to its ggml type, then repacked. */
static void mat_make(struct mat *m, uint32_t type, int rows, int cols)
{
    uint32_t base = repack_base_type(type);
    size_t rb = row_size(type, cols);
    m->data = malloc(rb * rows);
    m->deq = malloc(sizeof(float) * rows * cols);
    float *row = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) {
        /* Rows of different magnitudes and a few outliers, as in real weights. */
        float scale = 0.02f * (1 + r % 5);
        for (int c = 0; c < cols; c++) row[c] = uniform() * scale * (c % 97 == 3 ? 8.0f : 1.0f);
        quantize_row(base, row, m->data + rb * r, cols);
        dequantize_row(base, m->data + rb * r, m->deq + (size_t)r * cols, cols);
    }
    free(row);
    m->t = (struct tensor){m->data, base, rows, cols, rb * rows};
    if (type != base) {
        char err[ERRMSG_LEN];
        if (repack_tensor(&m->t, err) || m->t.type != type) abort();
    }
}

static void mat_free(struct mat *m)
{
    free(m->data);
    free(m->deq);
}

static float *make_x(int n_tok, int cols)
{
    float *x = malloc(sizeof(float) * n_tok * cols);
    for (int i = 0; i < n_tok * cols; i++) x[i] = uniform() * (i % 31 == 0 ? 4.0f : 1.0f);
    return x;
}

/* Allowed |y - reference| for one output, where the reference is the exact dot product of the
 * dequantized weights with the float activations:
 * - every type: float accumulation over `cols` terms, at most cols * 2^-24 * sum|w x| (the
 *   standard bound n*u; in practice far less);
 * - the block types: the kernels quantize the activations to int8 per block of 32 (256 for the
 *   super-blocks) with step d = max|x|/127, so each x is off by at most d/2, plus (Q8_0, whose d
 *   is stored in f16) 127 * 2^-11 * d: add sum|w| * that over each block (5% slack for the
 *   float computation of d and 1/d). The integer dot itself is exact. */
static double tolerance(uint32_t type, const float *w, const float *x, int cols)
{
    double sabs = 0, q = 0;
    for (int c = 0; c < cols; c++) sabs += fabs((double)w[c] * x[c]);
    double tol = cols * 0x1p-24 * sabs + 1e-30;
    type = repack_base_type(type);
    int bs = ggml_block_elems(type);
    if (bs > 1) {
        for (int b = 0; b < cols; b += bs) {
            double amax = 0, wsum = 0;
            for (int c = b; c < b + bs; c++) {
                amax = fmax(amax, fabs(x[c]));
                wsum += fabs(w[c]);
            }
            q += wsum * amax * (1.0 / 254 + 0x1p-11); /* + the f16 rounding of d (act_q8) */
        }
        tol += 1.05 * q;
    }
    return tol;
}

/* This architecture's kernel tables, lowest first (scalar, then avx2, avxvnni, avx512 or neon,
 * dotprod, i8mm). */
#define N_ISAS  kernel_tables_n
#define ISA(ii) kernel_tables[ii]->name

static int init_ctx(struct matmul_ctx *k, const char *isa, struct threadpool *tp, void **scratch,
                    int max_tok, int max_cols)
{
    char err[ERRMSG_LEN], *was = getenv("STRATA_ISA"); /* the run's own choice, put back */
    was = was ? strdup(was) : NULL;
    setenv("STRATA_ISA", isa, 1);
    *scratch = malloc(matmul_scratch_size(max_tok, max_cols) + 1);
    int rc = matmul_init(k, tp, *scratch, max_tok, max_cols, err);
    if (was)
        setenv("STRATA_ISA", was, 1);
    else
        unsetenv("STRATA_ISA");
    free(was);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return strcmp(matmul_isa_of(k), isa) == 0 ? 0 : 1; /* 1: this CPU lacks the ISA */
}

TEST(all_types_isas_batches_vs_reference)
{
    static const int n_toks[] = {1, 2, 3, 5, 17};
    static const int row_counts[] = {1, 7, 37}, group_counts[] = {16, 48, 80};
    int missing = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti];
        int cols = cols_for(type);
        for (size_t ri = 0; ri < 3; ri++) {
            int rows = repack_base_type(type) != type ? group_counts[ri] : row_counts[ri];
            struct mat m;
            mat_make(&m, type, rows, cols);
            float *x = make_x(17, cols);
            float *y = malloc(sizeof(float) * 17 * rows), *ys = malloc(sizeof(float) * 17 * rows);
            /* Per (token, row), whatever the batch and ISA: the exact dot, its tolerance, and the
             * bound on float summation order (2 n u sum|w x|) that an ISA may differ from scalar
             * by, the integer dots being the same. Computed once (emulated runs feel it). */
            double *ref = malloc(sizeof(double) * 17 * rows),
                   *tol = malloc(sizeof(double) * 17 * rows);
            double *order = malloc(sizeof(double) * 17 * rows);
            for (int t = 0; t < 17; t++)
                for (int r = 0; r < rows; r++) {
                    const float *wr = m.deq + (size_t)r * cols, *xt = x + (size_t)t * cols;
                    double d = 0, sabs = 0;
                    for (int c = 0; c < cols; c++) {
                        d += (double)wr[c] * xt[c];
                        sabs += fabs((double)wr[c] * xt[c]);
                    }
                    ref[t * rows + r] = d;
                    tol[t * rows + r] = tolerance(type, wr, xt, cols);
                    order[t * rows + r] = 2 * cols * 0x1p-24 * sabs + 1e-30;
                }
            for (size_t ni = 0; ni < 5; ni++) {
                int n_tok = n_toks[ni];
                for (int ii = 0; ii < N_ISAS; ii++) {
                    struct matmul_ctx k;
                    void *scratch;
                    int rc = init_ctx(&k, ISA(ii), NULL, &scratch, 17, cols);
                    CHECK(rc >= 0);
                    if (rc == 1) {
                        missing = 1;
                        free(scratch);
                        continue;
                    }
                    matmul(&k, ii == 0 ? ys : y, &m.t, x, n_tok);
                    free(scratch);
                    for (int i = 0; i < n_tok * rows; i++) {
                        int t = i / rows, r = i % rows;
                        double got = (ii == 0 ? ys : y)[i];
                        CHECKF(fabs(got - ref[i]) <= tol[i],
                               "%s %s rows=%d n_tok=%d: y[%d][%d] = %.9g, reference %.9g, "
                               "tolerance %.3g",
                               tensor_type_name(type), ISA(ii), rows, n_tok, t, r, got, ref[i],
                               tol[i]);
                        if (ii == 0) continue;
                        CHECKF(fabs(got - ys[i]) <= order[i],
                               "%s %s vs scalar rows=%d n_tok=%d: y[%d][%d] %.9g vs %.9g",
                               tensor_type_name(type), ISA(ii), rows, n_tok, t, r, got, ys[i]);
                    }
                }
            }
            free(ref);
            free(tol);
            free(order);
            free(x);
            free(y);
            free(ys);
            mat_free(&m);
        }
    }
    if (missing)
        printf("# some ISAs are missing on this CPU; tested: %s and below\n", matmul_isa());
}

/* Q4_0 works on blocks 4, 2 and 1 at a time (quads, a leftover pair, an odd last block): every
 * block count mod 4, against the reference, and a token alone equals it in a batch. */
TEST(q4_0_every_block_count)
{
    for (int nb = 1; nb <= 8; nb++) {
        int cols = 32 * nb, rows = 3;
        struct mat m;
        mat_make(&m, GGML_Q4_0, rows, cols);
        float *x = make_x(5, cols);
        float *y = malloc(sizeof(float) * 5 * rows), *one = malloc(sizeof(float) * rows);
        for (int ii = 0; ii < N_ISAS; ii++) {
            struct matmul_ctx k;
            void *scratch;
            int rc = init_ctx(&k, ISA(ii), NULL, &scratch, 5, cols);
            CHECK(rc >= 0);
            if (rc == 0) {
                matmul(&k, y, &m.t, x, 5);
                for (int t = 0; t < 5; t++) {
                    matmul(&k, one, &m.t, x + (size_t)t * cols, 1);
                    CHECKF(!memcmp(one, y + (size_t)t * rows, sizeof(float) * rows),
                           "%s %d blocks: token %d alone differs from in a batch", ISA(ii), nb, t);
                    for (int r = 0; r < rows; r++) {
                        const float *wr = m.deq + (size_t)r * cols, *xt = x + (size_t)t * cols;
                        double ref = 0;
                        for (int c = 0; c < cols; c++) ref += (double)wr[c] * xt[c];
                        double tol = tolerance(GGML_Q4_0, wr, xt, cols);
                        CHECKF(fabs(y[t * rows + r] - ref) <= tol,
                               "%s %d blocks: y[%d][%d] = %.9g, reference %.9g", ISA(ii), nb, t, r,
                               y[t * rows + r], ref);
                    }
                }
            }
            free(scratch);
        }
        free(x);
        free(y);
        free(one);
        mat_free(&m);
    }
}

/* A token's outputs do not depend on which batch it came in, nor on the thread count, nor on
 * being run through matmul_multi: bit for bit, so batched and one-by-one greedy decoding agree. */
TEST(batch_threads_multi_bit_identical)
{
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti];
        int cols = cols_for(type);
        struct mat m[3];
        int rows[3] = {13, 5, 22};
        if (repack_base_type(type) != type) /* parts of the rows split inside groups: rounded */
            rows[0] = 48, rows[1] = 16, rows[2] = 32;
        for (int i = 0; i < 3; i++) mat_make(&m[i], type, rows[i], cols);
        float *x = make_x(17, cols);
        float *one = malloc(sizeof(float) * 48), *batch[3], *multi[3]; /* the most rows */
        for (int i = 0; i < 3; i++) {
            batch[i] = malloc(sizeof(float) * 17 * rows[i]);
            multi[i] = malloc(sizeof(float) * 17 * rows[i]);
        }
        for (int nth = 1; nth <= 4; nth++) {
            char err[ERRMSG_LEN];
            struct threadpool *tp = threadpool_new(nth, err);
            CHECKF(tp, "%s", err);
            struct matmul_ctx k;
            void *scratch;
            CHECK(init_ctx(&k, matmul_isa(), tp, &scratch, 17, cols) == 0);
            const struct tensor *ws[3] = {&m[0].t, &m[1].t, &m[2].t};
            matmul_multi(&k, 3, multi, ws, x, 17);
            for (int i = 0; i < 3; i++) {
                matmul(&k, batch[i], &m[i].t, x, 17);
                CHECKF(!memcmp(batch[i], multi[i], sizeof(float) * 17 * rows[i]),
                       "%s: matmul_multi differs from matmul (matrix %d, %d threads)",
                       tensor_type_name(type), i, nth);
                for (int t = 0; t < 17; t += 4) {
                    matmul(&k, one, &m[i].t, x + (size_t)t * cols, 1);
                    CHECKF(!memcmp(one, batch[i] + (size_t)t * rows[i], sizeof(float) * rows[i]),
                           "%s: token %d alone differs from in a batch of 17 (%d threads)",
                           tensor_type_name(type), t, nth);
                }
            }
            free(scratch);
            threadpool_free(tp);
        }
        for (int i = 0; i < 3; i++) {
            free(batch[i]);
            free(multi[i]);
            mat_free(&m[i]);
        }
        free(one);
        free(x);
    }
}

/* The SIMD activation quantizers produce the scalar one's bytes: zero blocks, ties (x/d exactly
 * k + 0.5, which round to even), outliers. */
TEST(activation_quantizers_bit_identical)
{
    enum { N = 1024 };
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = uniform() * (i % 37 == 0 ? 50.0f : 1.0f);
    for (int i = 0; i < 32; i++) x[i] = 0.0f;                    /* an all-zero block */
    for (int i = 32; i < 64; i++) x[i] = (float)(i - 48) + 0.5f; /* amax 15.5 */
    x[32] = 127.0f;                                              /* d = 1: ties at k + 0.5 */
    static struct act_q8 a[N / 32], b[N / 32];
    static struct act_q8k ak[N / 256], bk[N / 256];
    static struct act_q4 a4[N / 64], b4[N / 64];
    quantize_act_q8(x, a, N / 32);
    quantize_act_q8k(x, ak, N / 256);
    quantize_act_q4(x, a4, N / 32 - 1); /* an odd count: the last pair has a zero partner */
    CHECK(!memcmp(a4[0].lo, a[0].qs, 16) && !memcmp(a4[0].lo + 16, a[1].qs, 16));
    CHECK(!memcmp(a4[0].hi, a[0].qs + 16, 16) && !memcmp(a4[0].hi + 16, a[1].qs + 16, 16));
    CHECK(a4[0].off[0] == a[0].neg8sum && a4[0].off[4] == a[1].neg8sum && a4[0].off[1] == 0);
    CHECK(a4[1].d[0] == a[2].d && a4[1].d[1] == a[3].d && a4[1].d[2] == 0);
    CHECK(a4[N / 64 - 1].d[1] == 0 && a4[N / 64 - 1].off[4] == 0 && a4[N / 64 - 1].hi[31] == 0);
    CHECK(a[0].d == 0 && a[0].qs[5] == 0);
    CHECK(a[1].d == 1.0f && a[1].qs[1] == -14 && a[1].qs[2] == -14 && a[1].qs[3] == -12);
    const struct kernel_table *const *tables = kernel_tables + 1; /* the SIMD ones */
    int ran = 0;
    for (int i = 0; i < kernel_tables_n - 1; i++) {
        struct matmul_ctx k;
        void *scratch;
        if (init_ctx(&k, tables[i]->name, NULL, &scratch, 1, 32) != 0) {
            free(scratch);
            continue;
        }
        free(scratch);
        ran++;
        memset(b, 0x55, sizeof b);
        memset(bk, 0x55, sizeof bk);
        memset(b4, 0x55, sizeof b4);
        tables[i]->quant_q8(x, b, N / 32);
        tables[i]->quant_q8k(x, bk, N / 256);
        tables[i]->quant_q4(x, b4, N / 32 - 1);
        CHECKF(!memcmp(a4, b4, sizeof a4), "%s: act_q4 differs from scalar", tables[i]->name);
        CHECKF(!memcmp(a, b, sizeof a), "%s: act_q8 differs from scalar", tables[i]->name);
        CHECKF(!memcmp(ak, bk, sizeof ak), "%s: act_q8k differs from scalar", tables[i]->name);
    }
    if (!ran) SKIP("no SIMD ISA on this CPU");
}

TEST(tensor_get_row_dequantizes)
{
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        int cols = cols_for(types[ti]);
        struct mat m;
        mat_make(&m, types[ti], 32, cols);
        float *out = malloc(sizeof(float) * cols);
        for (int r = 0; r < 32; r += 3) {
            tensor_get_row(&m.t, r, out);
            CHECK(!memcmp(out, m.deq + (size_t)r * cols, sizeof(float) * cols));
        }
        free(out);
        mat_free(&m);
    }
}

/* Matrices of different layouts with one activation format (Q8_0 rows, Q8_0 and Q4_0 groups) in
 * one matmul_multi: each gets its own kernel and row rounding, and the result is matmul's. */
TEST(multi_mixed_layouts)
{
    static const uint32_t mix[3] = {TENSOR_Q4_0_X16, GGML_Q8_0, TENSOR_Q8_0_X16};
    static const int rows[3] = {48, 13, 32};
    const int cols = 288, n_tok = 5;
    struct mat m[3];
    for (int i = 0; i < 3; i++) mat_make(&m[i], mix[i], rows[i], cols);
    float *x = make_x(n_tok, cols), *multi[3], *one = malloc(sizeof(float) * n_tok * 48);
    for (int i = 0; i < 3; i++) multi[i] = malloc(sizeof(float) * n_tok * rows[i]);
    const struct tensor *ws[3] = {&m[0].t, &m[1].t, &m[2].t};
    for (int nth = 1; nth <= 3; nth++) {
        char err[ERRMSG_LEN];
        struct threadpool *tp = threadpool_new(nth, err);
        CHECKF(tp, "%s", err);
        struct matmul_ctx k;
        void *scratch;
        CHECK(init_ctx(&k, matmul_isa(), tp, &scratch, n_tok, cols) == 0);
        matmul_multi(&k, 3, multi, ws, x, n_tok);
        for (int i = 0; i < 3; i++) {
            matmul(&k, one, &m[i].t, x, n_tok);
            CHECKF(!memcmp(one, multi[i], sizeof(float) * n_tok * rows[i]),
                   "%s in a mixed matmul_multi differs from matmul (%d threads)",
                   tensor_type_name(mix[i]), nth);
        }
        free(scratch);
        threadpool_free(tp);
    }
    for (int i = 0; i < 3; i++) {
        free(multi[i]);
        mat_free(&m[i]);
    }
    free(one);
    free(x);
}

/* repack.h's layout, byte for byte: block b of row r lands in record b of group r / 16, its
 * scale at d[r % 16] and quant byte i at 64 * (i / 4) + 32 * (r % 16 / 8) + 4 * (r % 8) + i % 4
 * (Q8_0 quants +128). Only Q4_0/Q8_0 with rows % 16 == 0 are repacked. */
TEST(repack_layout_exact)
{
    char err[ERRMSG_LEN];
    const int rows = 32, cols = 96, nb = 3;
    struct mat q4, q8;
    mat_make(&q4, GGML_Q4_0, rows, cols);
    mat_make(&q8, GGML_Q8_0, rows, cols);
    uint8_t *src4 = malloc(q4.t.nbytes), *src8 = malloc(q8.t.nbytes);
    memcpy(src4, q4.data, q4.t.nbytes);
    memcpy(src8, q8.data, q8.t.nbytes);
    CHECK(repack_tensor(&q4.t, err) == 0 && q4.t.type == TENSOR_Q4_0_X16);
    CHECK(repack_tensor(&q8.t, err) == 0 && q8.t.type == TENSOR_Q8_0_X16);
    int bad = 0;
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) {
            const struct block_q4_0 *s4 = (const struct block_q4_0 *)src4 + r * nb + b;
            const struct block_q8_0 *s8 = (const struct block_q8_0 *)src8 + r * nb + b;
            const struct block_q4_0x16 *g4 =
                (const struct block_q4_0x16 *)q4.data + r / 16 * nb + b;
            const struct block_q8_0x16 *g8 =
                (const struct block_q8_0x16 *)q8.data + r / 16 * nb + b;
            int l = r % 16;
            bad += g4->d[l] != s4->d || g8->d[l] != s8->d;
            for (int i = 0; i < 32; i++) {
                size_t at = (size_t)64 * (i / 4) + 32 * (l / 8) + 4 * (l % 8) + i % 4;
                if (i < 16) bad += g4->qs[at] != s4->qs[i];
                bad += g8->qs[at] != (uint8_t)(s8->qs[i] + 128);
            }
        }
    CHECKF(bad == 0, "%d scales or quants not where repack.h says", bad);
    uint8_t *copy = malloc(q4.t.nbytes);
    memcpy(copy, src4, q4.t.nbytes);
    struct tensor odd = {copy, GGML_Q4_0, 24, cols, 0}, f32 = {copy, GGML_F32, 32, cols, 0};
    CHECK(!repack_eligible(&odd) && !repack_eligible(&f32));
    CHECK(repack_tensor(&odd, err) == 0 && odd.type == GGML_Q4_0);
    CHECK(repack_tensor(&f32, err) == 0 && f32.type == GGML_F32);
    CHECK(!memcmp(copy, src4, q4.t.nbytes)); /* left alone */
    free(copy);
    free(src4);
    free(src8);
    mat_free(&q4);
    mat_free(&q8);
}

/* Every kernel table has a kernel for every layout (matmul would call through NULL). */
TEST(kernel_tables_complete)
{
    CHECK(kernel_tables[0] == &kernels_scalar);
    for (int i = 0; i < kernel_tables_n; i++)
        for (int k = 0; k < KT_COUNT; k++)
            CHECKF(kernel_tables[i]->tile[k], "%s: no kernel for layout %d", kernel_tables[i]->name,
                   k);
}

/* Every layout's records give back each row's ggml block byte for byte (repack_block), and
 * any byte range of the rows (repack_read_gguf). */
TEST(repack_roundtrip_every_layout)
{
    char err[ERRMSG_LEN];
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti], base = repack_base_type(type);
        if (base == type) continue;
        const int rows = 32, cols = ggml_block_elems(base) == 256 ? 512 : 96;
        const int nb = cols / ggml_block_elems(base);
        struct mat m;
        mat_make(&m, base, rows, cols);
        const size_t rb = row_size(base, cols), bb = rb / nb;
        uint8_t *src = malloc(m.t.nbytes);
        memcpy(src, m.data, m.t.nbytes);
        CHECK(repack_tensor(&m.t, err) == 0 && m.t.type == type);
        CHECK(memcmp(src, m.data, m.t.nbytes) != 0);
        for (int r = 0; r < rows; r++)
            for (int b = 0; b < nb; b++) {
                uint8_t blk[512];
                repack_block(&m.t, r, b, blk);
                CHECKF(!memcmp(blk, src + r * rb + b * bb, bb), "%s: row %d block %d differs",
                       tensor_type_name(type), r, b);
            }
        /* any byte range back in ggml's rows (what a fabric holder sends): all of it, and ranges
         * that start and end inside blocks, rows and groups */
        uint8_t *back = malloc(m.t.nbytes);
        repack_read_gguf(&m.t, 0, m.t.nbytes, back);
        CHECKF(!memcmp(back, src, m.t.nbytes), "%s: the whole tensor", tensor_type_name(type));
        for (size_t off = 0; off < m.t.nbytes; off += 1 + off / 2 + bb / 3) {
            size_t len = (m.t.nbytes - off) / 3 + 1;
            memset(back, 0xa5, m.t.nbytes);
            repack_read_gguf(&m.t, off, len, back);
            CHECKF(!memcmp(back, src + off, len) && back[len] == 0xa5, "%s: %zu bytes at %zu",
                   tensor_type_name(type), len, off);
        }
        free(back);
        free(src);
        mat_free(&m);
    }
}

/* The super-block records' kernels finish each row with the scalar kernel's float arithmetic, so
 * repacked and row layouts give the same bits, on every ISA, and so do the ISAs; weights and
 * activations at the levels' extremes (all +-1: every activation +-127) check that no 16-bit sum
 * overflows anywhere. */
TEST(kquant_layouts_bit_identical)
{
    char err[ERRMSG_LEN];
    const int rows = 32, cols = 512, n_tok = 3;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti], base = repack_base_type(type);
        if (base == type || ggml_block_elems(base) != 256) continue;
        for (int extreme = 0; extreme < 2; extreme++) {
            struct mat m;
            mat_make(&m, base, rows, cols);
            float *x = make_x(n_tok, cols);
            if (extreme) {
                float *row = malloc(sizeof(float) * cols);
                size_t rb = row_size(base, cols);
                for (int r = 0; r < rows; r++) {
                    for (int c = 0; c < cols; c++) row[c] = (c * 7 + r) % 3 ? 1.0f : -1.0f;
                    quantize_row(base, row, m.data + rb * r, cols);
                }
                free(row);
                for (int i = 0; i < n_tok * cols; i++) x[i] = (i * 5) % 7 < 4 ? 1.0f : -1.0f;
            }
            struct mat rp = m;
            rp.data = malloc(m.t.nbytes);
            memcpy(rp.data, m.data, m.t.nbytes);
            rp.t.data = rp.data;
            CHECK(repack_tensor(&rp.t, err) == 0 && rp.t.type == type);
            float *want = malloc(sizeof(float) * n_tok * rows),
                  *got = malloc(sizeof(float) * n_tok * rows);
            for (int ii = 0; ii < N_ISAS; ii++)
                for (int layout = 0; layout < 2; layout++) {
                    struct matmul_ctx k;
                    void *scratch;
                    int rc = init_ctx(&k, ISA(ii), NULL, &scratch, n_tok, cols);
                    if (rc == 0) {
                        matmul(&k, ii == 0 && layout == 0 ? want : got, layout ? &rp.t : &m.t, x,
                               n_tok);
                        if (ii || layout)
                            CHECKF(!memcmp(want, got, sizeof(float) * n_tok * rows),
                                   "%s %s%s: not the scalar row kernel's bits",
                                   tensor_type_name(type), ISA(ii), extreme ? ", extremes" : "");
                    }
                    free(scratch);
                }
            free(want);
            free(got);
            free(rp.data);
            free(x);
            free(m.deq);
            free(m.data);
        }
    }
}

/* Weights and activations at their levels' extremes (every value +-1: activations +-127, weights
 * at their end levels), every type and layout, every ISA against the reference: the 16-bit
 * partial sums the kernels take must not overflow. */
TEST(extremes_every_type)
{
    char err[ERRMSG_LEN];
    const int rows = 32, n_tok = 2;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        uint32_t type = types[ti], base = repack_base_type(type);
        if (ggml_block_elems(base) < 32) continue;
        const int cols = cols_for(type);
        struct mat m;
        mat_make(&m, base, rows, cols);
        float *row = malloc(sizeof(float) * cols), *x = make_x(n_tok, cols);
        const size_t rb = row_size(base, cols);
        for (int r = 0; r < rows; r++) {
            for (int c = 0; c < cols; c++) row[c] = (c * 7 + r) % 3 ? 1.0f : -1.0f;
            quantize_row(base, row, m.data + rb * r, cols);
            dequantize_row(base, m.data + rb * r, m.deq + (size_t)r * cols, cols);
        }
        for (int i = 0; i < n_tok * cols; i++) x[i] = (i * 5) % 7 < 4 ? 1.0f : -1.0f;
        if (type != base) CHECK(repack_tensor(&m.t, err) == 0 && m.t.type == type);
        float *y = malloc(sizeof(float) * n_tok * rows);
        for (int ii = 0; ii < N_ISAS; ii++) {
            struct matmul_ctx k;
            void *scratch;
            if (init_ctx(&k, ISA(ii), NULL, &scratch, n_tok, cols) == 0) {
                matmul(&k, y, &m.t, x, n_tok);
                for (int t = 0; t < n_tok; t++)
                    for (int r = 0; r < rows; r++) {
                        const float *wr = m.deq + (size_t)r * cols, *xt = x + (size_t)t * cols;
                        double ref = 0;
                        for (int c = 0; c < cols; c++) ref += (double)wr[c] * xt[c];
                        CHECKF(fabs(y[t * rows + r] - ref) <= tolerance(type, wr, xt, cols),
                               "%s %s extremes: y[%d][%d] = %.6g, reference %.6g",
                               tensor_type_name(type), ISA(ii), t, r, y[t * rows + r], ref);
                    }
            }
            free(scratch);
        }
        free(y);
        free(row);
        free(x);
        mat_free(&m);
    }
}

/* STRATA_ISA names a table: that one when the CPU has it, else a lower one, never a higher. The
 * tables are not nested: a Zen 4 has avx512 but not avxvnni, so there avxvnni gives avx2. Each
 * name gives a table at most the name's and the best, and no lower than a lower name gave. */
TEST(isa_override)
{
    char *was = getenv("STRATA_ISA");
    was = was ? strdup(was) : NULL;
    unsetenv("STRATA_ISA");
    const char *best = matmul_isa();
    int rank = -1;
    for (int i = 0; i < kernel_tables_n; i++)
        if (!strcmp(best, ISA(i))) rank = i;
    CHECKF(rank >= 0, "best ISA %s is not one of this architecture's tables", best);
    int prev = 0;
    for (int i = 0; i < kernel_tables_n; i++) {
        setenv("STRATA_ISA", ISA(i), 1);
        const char *got = matmul_isa();
        int r = -1;
        for (int j = 0; j < kernel_tables_n; j++)
            if (!strcmp(got, ISA(j))) r = j;
        const int most = i < rank ? i : rank;
        CHECKF(r <= most && r >= prev && (i != 0 || r == 0) && (i < rank || r == rank),
               "STRATA_ISA=%s gave %s (best %s)", ISA(i), got, best);
        prev = r;
    }
    setenv("STRATA_ISA", "no-such-isa", 1);
    CHECK_STR(matmul_isa(), best);
    if (was)
        setenv("STRATA_ISA", was, 1);
    else
        unsetenv("STRATA_ISA");
    free(was);
}

struct tp_job {
    atomic_int calls[8];
    atomic_long sum;
    atomic_int bad_nth;
    int n;
};

static void tp_fn(void *arg, int ith, int nth)
{
    struct tp_job *j = arg;
    atomic_fetch_add(&j->calls[ith], 1);
    if (nth != j->n) atomic_fetch_add(&j->bad_nth, 1); /* no CHECK: not the test's thread */
    long s = 0;
    for (int i = ith; i < 1000; i += nth) s += i;
    atomic_fetch_add(&j->sum, s);
}

TEST(threadpool_runs_each_part_once_per_job)
{
    for (int n = 1; n <= 4; n++) {
        char err[ERRMSG_LEN];
        struct threadpool *tp = threadpool_new(n, err);
        CHECKF(tp, "%s", err);
        CHECK_EQ_INT(threadpool_size(tp), n);
        struct tp_job j;
        memset(&j, 0, sizeof j);
        j.n = n;
        const int jobs = 2000;
        for (int i = 0; i < jobs; i++) {
            atomic_store(&j.sum, 0);
            threadpool_run(tp, tp_fn, &j);
            CHECK_EQ_INT(atomic_load(&j.sum), 999 * 1000 / 2);
            if (i == jobs / 2) usleep(3000); /* let workers fall asleep on the futex */
        }
        for (int i = 0; i < n; i++) CHECK_EQ_INT(atomic_load(&j.calls[i]), jobs);
        CHECK_EQ_INT(atomic_load(&j.bad_nth), 0);
        threadpool_free(tp);
    }
    char err[ERRMSG_LEN];
    CHECK(threadpool_new(0, err) == NULL);
    CHECK(strstr(err, "threads") != NULL);
}

struct parts_job {
    atomic_int seen[1000];
    atomic_int wrong_n;
    int n;
};

static void parts_fn(void *arg, int i, int n)
{
    struct parts_job *j = arg;
    if (n != j->n || i < 0 || i >= n)
        atomic_fetch_add(&j->wrong_n, 1);
    else
        atomic_fetch_add(&j->seen[i], 1);
}

/* threadpool_run_parts: every part exactly once, for part counts below, at and above the pool
 * size, over many jobs in a row (a late worker must never run a part of the next job). */
TEST(threadpool_parts_each_once)
{
    static const int counts[] = {1, 2, 3, 7, 64, 1000};
    for (int nth = 1; nth <= 4; nth++) {
        char err[ERRMSG_LEN];
        struct threadpool *tp = threadpool_new(nth, err);
        CHECKF(tp, "%s", err);
        static struct parts_job j;
        for (int rep = 0; rep < 300; rep++) {
            int n = counts[rep % 6];
            memset(&j, 0, sizeof j);
            j.n = n;
            threadpool_run_parts(tp, parts_fn, &j, n);
            CHECK_EQ_INT(atomic_load(&j.wrong_n), 0);
            for (int i = 0; i < n; i++)
                CHECKF(atomic_load(&j.seen[i]) == 1, "%d threads, %d parts: part %d ran %d times",
                       nth, n, i, atomic_load(&j.seen[i]));
        }
        threadpool_free(tp);
    }
}

int main(void)
{
    printf("# matmul ISA on this CPU: %s; the tables compared here:", matmul_isa());
    for (int i = 0; i < kernel_tables_n; i++) { /* which ones this CPU runs (say which ran) */
        char *was = getenv("STRATA_ISA");
        was = was ? strdup(was) : NULL;
        setenv("STRATA_ISA", ISA(i), 1);
        printf(" %s%s", ISA(i), strcmp(matmul_isa(), ISA(i)) ? " (not on this CPU)" : "");
        if (was)
            setenv("STRATA_ISA", was, 1);
        else
            unsetenv("STRATA_ISA");
        free(was);
    }
    printf("\n");
    RUN(all_types_isas_batches_vs_reference);
    RUN(batch_threads_multi_bit_identical);
    RUN(q4_0_every_block_count);
    RUN(activation_quantizers_bit_identical);
    RUN(tensor_get_row_dequantizes);
    RUN(multi_mixed_layouts);
    RUN(repack_layout_exact);
    RUN(kernel_tables_complete);
    RUN(repack_roundtrip_every_layout);
    RUN(kquant_layouts_bit_identical);
    RUN(extremes_every_type);
    RUN(isa_override);
    RUN(threadpool_runs_each_part_once_per_job);
    RUN(threadpool_parts_each_once);
    CHECK_DONE();
}
