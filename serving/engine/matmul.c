/* matmul: the driver (ISA choice, activation quantization, splitting rows over threads) and the
 * scalar reference kernels. The SIMD kernels live in kernels_avx2*.c and kernels_avx512.c (x86-64)
 * and kernels_neon*.c (aarch64). */
#include "serving/engine/matmul.h"

#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- formats -------------------------------------------------------------------------------- */

static int kernel_type(uint32_t t)
{
    switch (t) {
    case GGML_F32:
        return KT_F32;
    case GGML_F16:
        return KT_F16;
    case GGML_BF16:
        return KT_BF16;
    case GGML_Q8_0:
        return KT_Q8_0;
    case GGML_Q4_0:
        return KT_Q4_0;
    case GGML_Q4_1:
        return KT_Q4_1;
    case GGML_Q5_0:
        return KT_Q5_0;
    case GGML_Q5_1:
        return KT_Q5_1;
    case GGML_IQ4_NL:
        return KT_IQ4_NL;
    case GGML_Q2_K:
        return KT_Q2_K;
    case GGML_Q3_K:
        return KT_Q3_K;
    case GGML_Q4_K:
        return KT_Q4_K;
    case GGML_Q5_K:
        return KT_Q5_K;
    case GGML_Q6_K:
        return KT_Q6_K;
    case GGML_IQ4_XS:
        return KT_IQ4_XS;
    case TENSOR_Q8_0_X16:
        return KT_Q8_0_X16;
    case TENSOR_Q4_0_X16:
        return KT_Q4_0_X16;
    case TENSOR_Q4_K_X16:
        return KT_Q4_K_X16;
    case TENSOR_Q6_K_X16:
        return KT_Q6_K_X16;
    case TENSOR_Q5_K_X16:
        return KT_Q5_K_X16;
    case TENSOR_Q2_K_X16:
        return KT_Q2_K_X16;
    case TENSOR_Q3_K_X16:
        return KT_Q3_K_X16;
    case TENSOR_IQ4_XS_X16:
        return KT_IQ4_XS_X16;
    case TENSOR_Q4_1_X16:
        return KT_Q4_1_X16;
    case TENSOR_Q5_0_X16:
        return KT_Q5_0_X16;
    case TENSOR_Q5_1_X16:
        return KT_Q5_1_X16;
    case TENSOR_IQ4_NL_X16:
        return KT_IQ4_NL_X16;
    }
    return -1;
}

/* Bytes per row; a repacked tensor's group of 16 rows takes 16 source rows' bytes. */
static size_t row_bytes(uint32_t t, int cols)
{
    return (size_t)ggml_row_bytes(repack_base_type(t), (uint64_t)cols);
}

/* Which activation format a weight type wants: 0 floats, 1 act_q8, 2 act_q8k, 3 act_q4. */
static int act_format(uint32_t t)
{
    /* the 16-row records of the blocks of 32 take act_q8 */
    if (repack_base_type(t) != t && ggml_block_elems(repack_base_type(t)) == 32) return 1;
    switch (repack_base_type(t)) {
    case GGML_Q8_0:
        return 1;
    case GGML_Q2_K:
    case GGML_Q3_K:
    case GGML_Q4_K:
    case GGML_Q5_K:
    case GGML_Q6_K:
    case GGML_IQ4_XS:
        return 2;
    case GGML_Q4_0:
    case GGML_Q4_1:
    case GGML_Q5_0:
    case GGML_Q5_1:
    case GGML_IQ4_NL:
        return 3;
    }
    return 0;
}

/* Rows a kernel call must start on and take a multiple of. */
static int row_group(uint32_t t)
{
    return repack_base_type(t) != t ? REPACK_ROWS : 1;
}

static size_t act_bytes(int fmt, int cols)
{
    return fmt == 1   ? (size_t)cols / 32 * sizeof(struct act_q8)
           : fmt == 2 ? (size_t)cols / QK_K * sizeof(struct act_q8k)
           : fmt == 3 ? ((size_t)cols / 32 + 1) / 2 * sizeof(struct act_q4)
                      : (size_t)cols * sizeof(float);
}

/* Round to nearest even for |v| < 2^22 (the float addition rounds), like quant.c. */
static inline int round_even(float v)
{
    float t = v + 12582912.f;
    uint32_t i;
    memcpy(&i, &t, 4);
    return (int)(i & 0x007fffff) - 0x00400000;
}

void quantize_act_q8(const float *x, struct act_q8 *a, int nb)
{
    for (int b = 0; b < nb; b++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float id = amax > 0 ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = round_even(x[j] * id);
            a[b].qs[j] = (int8_t)q;
            sum += q;
        }
        const float d = amax / 127.0f;
        a[b].d = fp16_to_f32(f32_to_fp16(d));
        a[b].neg8sum = -8 * sum;
        a[b].s = fp16_to_f32(f32_to_fp16(d * (float)sum));
    }
}

void quantize_act_q8k(const float *x, struct act_q8k *a, int nb)
{
    for (int b = 0; b < nb; b++, x += QK_K) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        if (!amax) {
            memset(&a[b], 0, sizeof a[b]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int s = 0; s < 16; s++) {
            int sum = 0;
            for (int j = 16 * s; j < 16 * s + 16; j++) {
                int q = round_even(iscale * x[j]);
                a[b].qs[j] = (int8_t)(q < 127 ? q : 127);
                sum += a[b].qs[j];
            }
            a[b].bsums[s] = (int16_t)sum;
        }
        a[b].d = 1 / iscale;
    }
}

void act_q4_pack(const struct act_q8 q[2], struct act_q4 *a)
{
    memset(a, 0, sizeof *a);
    for (int h = 0; h < 2; h++) {
        memcpy(a->lo + 16 * h, q[h].qs, 16);
        memcpy(a->hi + 16 * h, q[h].qs + 16, 16);
        a->off[4 * h] = q[h].neg8sum;
        a->d[h] = q[h].d;
        a->s[h] = q[h].s;
    }
}

void quantize_act_q4(const float *x, struct act_q4 *a, int nb)
{
    for (int b = 0; b < nb; b += 2) {
        struct act_q8 q[2] = {0};
        quantize_act_q8(x + 32 * b, q, nb - b >= 2 ? 2 : 1);
        act_q4_pack(q, a + b / 2);
    }
}

static void quantize_act(const struct kernel_table *kt, int fmt, const float *x, void *out,
                         int cols)
{
    if (fmt == 1) kt->quant_q8(x, out, cols / 32);
    if (fmt == 2) kt->quant_q8k(x, out, cols / QK_K);
    if (fmt == 3) kt->quant_q4(x, out, cols / 32);
}

float matmul_f16_table[1 << 16];
static pthread_once_t f16_table_once = PTHREAD_ONCE_INIT;

static void f16_table_fill(void)
{
    for (uint32_t h = 0; h < (1u << 16); h++) matmul_f16_table[h] = fp16_to_f32((uint16_t)h);
}

/* ---- scalar kernels: the reference the SIMD kernels are tested against ---------------------- */

static void tile_f32_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                            int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const float *wr = (const float *)(w + r * ws), *xt = (const float *)(x + t * xs);
            float s = 0;
            for (int c = 0; c < cols; c++) s += wr[c] * xt[c];
            y[t * ys + r] = s;
        }
}

static void tile_f16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                            int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const uint16_t *wr = (const uint16_t *)(w + r * ws);
            const float *xt = (const float *)(x + t * xs);
            float s = 0;
            for (int c = 0; c < cols; c++) s += fp16_to_f32(wr[c]) * xt[c];
            y[t * ys + r] = s;
        }
}

static void tile_bf16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                             int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const uint16_t *wr = (const uint16_t *)(w + r * ws);
            const float *xt = (const float *)(x + t * xs);
            float s = 0;
            for (int c = 0; c < cols; c++) s += bf16_to_f32(wr[c]) * xt[c];
            y[t * ys + r] = s;
        }
}

static void tile_q8_0_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                             int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const struct block_q8_0 *wb = (const struct block_q8_0 *)(w + r * ws);
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                int isum = 0;
                for (int j = 0; j < 32; j++) isum += wb[b].qs[j] * a[b].qs[j];
                s += fp16_to_f32(wb[b].d) * a[b].d * (float)isum;
            }
            y[t * ys + r] = s;
        }
}

static void tile_q4_0_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                             int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const struct block_q4_0 *wb = (const struct block_q4_0 *)(w + r * ws);
            const struct act_q4 *a = (const struct act_q4 *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                const struct act_q4 *p = &a[b / 2];
                int h = b % 2, isum = p->off[4 * h];
                for (int j = 0; j < 16; j++)
                    isum += (wb[b].qs[j] & 0xf) * p->lo[16 * h + j] +
                            (wb[b].qs[j] >> 4) * p->hi[16 * h + j];
                s += fp16_to_f32(wb[b].d) * p->d[h] * (float)isum;
            }
            y[t * ys + r] = s;
        }
}

/* The 16-row groups (repack.h): each row's dot is the plain kernel's, with the quants found
 * where repack put them. */
static void tile_q8_0_x16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                                 int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const struct block_q8_0x16 *g =
                (const struct block_q8_0x16 *)(w + (size_t)(r / REPACK_ROWS) * REPACK_ROWS * ws);
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs);
            int lane = r % REPACK_ROWS;
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                int isum = 0;
                for (int j = 0; j < 32; j++)
                    isum += (g[b].qs[repack_quant_at(lane, j)] - 128) * a[b].qs[j];
                s += fp16_to_f32(g[b].d[lane]) * a[b].d * (float)isum;
            }
            y[t * ys + r] = s;
        }
}

static void tile_q4_0_x16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,
                                 int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const struct block_q4_0x16 *g =
                (const struct block_q4_0x16 *)(w + (size_t)(r / REPACK_ROWS) * REPACK_ROWS * ws);
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs);
            int lane = r % REPACK_ROWS;
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                int isum = a[b].neg8sum;
                for (int j = 0; j < 16; j++) {
                    uint8_t q = g[b].qs[repack_quant_at(lane, j)];
                    isum += (q & 0xf) * a[b].qs[j] + (q >> 4) * a[b].qs[j + 16];
                }
                s += fp16_to_f32(g[b].d[lane]) * a[b].d * (float)isum;
            }
            y[t * ys + r] = s;
        }
}

/* The nibble formats in rows against act_q4: block b's activations are pair b / 2, half b % 2.
 * Each kernel's integer dot is exact; per block it adds d_w * d_x * dot (+ m_w * s_x for the
 * formats with a minimum, as ggml's Q8_1 dot products do). */
static const int8_t *act_q4_lo(const struct act_q4 *a, int b)
{
    return a[b / 2].lo + 16 * (b % 2);
}
static const int8_t *act_q4_hi(const struct act_q4 *a, int b)
{
    return a[b / 2].hi + 16 * (b % 2);
}
static float act_q4_s(const struct act_q4 *a, int b)
{
    return a[b / 2].s[b % 2];
}
static float act_q4_d(const struct act_q4 *a, int b)
{
    return a[b / 2].d[b % 2];
}

/* Integer dot of 32 quants (q[0..15] meet lo, q[16..31] hi) with a block's activations. */
static int dot32_q4(const int *q, const struct act_q4 *a, int b)
{
    const int8_t *lo = act_q4_lo(a, b), *hi = act_q4_hi(a, b);
    int isum = 0;
    for (int j = 0; j < 16; j++) isum += q[j] * lo[j] + q[j + 16] * hi[j];
    return isum;
}

/* The 32 quants of block b of a nibble format, as the integers the format multiplies by d. */
static void nibble_quants(int kt, const uint8_t *row, int b, int *q)
{
    const uint8_t *qs = NULL, *qh = NULL;
    switch (kt) {
    case KT_Q4_1:
        qs = ((const struct block_q4_1 *)row)[b].qs;
        break;
    case KT_Q5_0:
        qs = ((const struct block_q5_0 *)row)[b].qs, qh = ((const struct block_q5_0 *)row)[b].qh;
        break;
    case KT_Q5_1:
        qs = ((const struct block_q5_1 *)row)[b].qs, qh = ((const struct block_q5_1 *)row)[b].qh;
        break;
    default: /* KT_IQ4_NL */
        qs = ((const struct block_iq4_nl *)row)[b].qs;
    }
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0xf;
        q[j + 16] = qs[j] >> 4;
        if (qh) {
            q[j] |= (qh[j / 8] >> (j % 8) & 1) << 4;
            q[j + 16] |= (qh[2 + j / 8] >> (j % 8) & 1) << 4;
        }
        if (kt == KT_IQ4_NL) q[j] = kvalues_iq4nl[q[j]], q[j + 16] = kvalues_iq4nl[q[j + 16]];
        if (kt == KT_Q5_0) q[j] -= 16, q[j + 16] -= 16;
    }
}

static void nibble_tile_scalar(int kt, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                               size_t xs, int nt, int cols, float *y, size_t ys)
{
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *row = w + r * ws;
            const struct act_q4 *a = (const struct act_q4 *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                int q[32];
                nibble_quants(kt, row, b, q);
                const float dx = act_q4_d(a, b);
                const int dot = dot32_q4(q, a, b);
                if (kt == KT_Q4_1 || kt == KT_Q5_1) {
                    const uint16_t *dm =
                        (const uint16_t *)(row + (size_t)b * (kt == KT_Q4_1 ? 20 : 24));
                    s += fp16_to_f32(dm[0]) * dx * (float)dot + fp16_to_f32(dm[1]) * act_q4_s(a, b);
                } else {
                    const uint16_t *d =
                        (const uint16_t *)(row + (size_t)b * (kt == KT_Q5_0 ? 22 : 18));
                    s += fp16_to_f32(*d) * dx * (float)dot;
                }
            }
            y[t * ys + r] = s;
        }
}

#define NIBBLE_SCALAR(name, KT)                                                                    \
    static void tile_##name##_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x,        \
                                     size_t xs, int nt, int cols, float *y, size_t ys)             \
    {                                                                                              \
        nibble_tile_scalar(KT, w, ws, nr, x, xs, nt, cols, y, ys);                                 \
    }
NIBBLE_SCALAR(q4_1, KT_Q4_1)
NIBBLE_SCALAR(q5_0, KT_Q5_0)
NIBBLE_SCALAR(q5_1, KT_Q5_1)
NIBBLE_SCALAR(iq4_nl, KT_IQ4_NL)
#undef NIBBLE_SCALAR

/* The super-block formats against act_q8k: per super-block, an exact integer sum of
 * (sub-block scale) x (sub-block dot), then d_w * d_x * isum (- dmin_w * d_x * msum, the mins
 * against the activations' sums). Offsets (Q3_K's -4, Q6_K's -32) come in through bsums. */

/* Q2_K: 16 sub-blocks of 16, q 0..3. */
static void kq_q2_K(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_q2_K *b = (const struct block_q2_K *)blk;
    *isum = *msum = 0;
    for (int j = 0; j < 16; j++) {
        int dot = 0;
        for (int e = 16 * j; e < 16 * j + 16; e++)
            dot += ((b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3) * a->qs[e];
        *isum += (b->scales[j] & 0xf) * dot;
        *msum += (b->scales[j] >> 4) * a->bsums[j];
    }
}

/* Q3_K: 16 sub-blocks of 16, q = 0..7 (the stored bits; the format subtracts 4), scale - 32. */
static void kq_q3_K(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_q3_K *b = (const struct block_q3_K *)blk;
    *isum = *msum = 0;
    for (int j = 0; j < 16; j++) {
        int dot = 0;
        for (int e = 16 * j; e < 16 * j + 16; e++) {
            int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
            q |= (b->hmask[e % 32] >> (e / 32) & 1) << 2;
            dot += q * a->qs[e];
        }
        *isum += (q3_K_scale(j, b->scales) - 32) * (dot - 4 * a->bsums[j]);
    }
}

/* Q4_K and Q5_K: 8 sub-blocks of 32, 6-bit scales and mins. */
static void kq_q45_K(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                     const struct act_q8k *a, int *isum, int *msum)
{
    *isum = *msum = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        q4_K_scale_min(j, scales, &sc, &m);
        const uint8_t *q = qs + 32 * (j / 2);
        int dot = 0;
        for (int l = 0; l < 32; l++) {
            int v = j & 1 ? q[l] >> 4 : q[l] & 0xf;
            if (qh) v |= (qh[l] >> j & 1) << 4;
            dot += v * a->qs[32 * j + l];
        }
        *isum += sc * dot;
        *msum += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
}

static void kq_q4_K(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_q4_K *b = (const struct block_q4_K *)blk;
    kq_q45_K(b->scales, b->qs, NULL, a, isum, msum);
}

static void kq_q5_K(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_q5_K *b = (const struct block_q5_K *)blk;
    kq_q45_K(b->scales, b->qs, b->qh, a, isum, msum);
}

/* Q6_K: 16 sub-blocks of 16, q = 0..63 (the format subtracts 32), int8 scales. */
static void kq_q6_K(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_q6_K *b = (const struct block_q6_K *)blk;
    *isum = *msum = 0;
    for (int j = 0; j < 16; j++) {
        int dot = 0;
        for (int e = 16 * j; e < 16 * j + 16; e++) {
            const int h = e / 128, s = e % 128 / 32, l = e % 32;
            const uint8_t ql = b->ql[64 * h + l + 32 * (s & 1)];
            int q = (s < 2 ? ql & 0xf : ql >> 4) | ((b->qh[32 * h + l] >> (2 * s)) & 3) << 4;
            dot += q * a->qs[e];
        }
        *isum += b->scales[j] * (dot - 32 * a->bsums[j]);
    }
}

/* IQ4_XS: 8 sub-blocks of 32, levels from kvalues_iq4nl, 6-bit scales - 32. */
static void kq_iq4_xs(const uint8_t *blk, const struct act_q8k *a, int *isum, int *msum)
{
    const struct block_iq4_xs *b = (const struct block_iq4_xs *)blk;
    *isum = *msum = 0;
    for (int j = 0; j < 8; j++) {
        const uint8_t *q = b->qs + 16 * j;
        const int8_t *xq = a->qs + 32 * j;
        int dot = 0;
        for (int l = 0; l < 16; l++)
            dot += kvalues_iq4nl[q[l] & 0xf] * xq[l] + kvalues_iq4nl[q[l] >> 4] * xq[l + 16];
        *isum += (iq4_xs_scale(j, b) - 32) * dot;
    }
}

/* Where d and dmin sit in each super-block (dmin: -1 for the formats without mins). */
static void kq_scales(int kt, const uint8_t *blk, float *d, float *dmin)
{
    uint16_t h[2] = {0, 0};
    switch (kt) {
    case KT_Q2_K:
        memcpy(h, blk + offsetof(struct block_q2_K, d), 4);
        break;
    case KT_Q3_K:
        memcpy(h, blk + offsetof(struct block_q3_K, d), 2);
        break;
    case KT_Q4_K:
        memcpy(h, blk + offsetof(struct block_q4_K, d), 4);
        break;
    case KT_Q5_K:
        memcpy(h, blk + offsetof(struct block_q5_K, d), 4);
        break;
    case KT_Q6_K:
        memcpy(h, blk + offsetof(struct block_q6_K, d), 2);
        break;
    case KT_IQ4_XS:
        memcpy(h, blk + offsetof(struct block_iq4_xs, d), 2);
        break;
    }
    *d = fp16_to_f32(h[0]);
    *dmin = fp16_to_f32(h[1]);
}

/* One super-block's share of a dot product, as every super-block kernel computes it. */
static float kquant_block(int kt, const uint8_t *blk, const struct act_q8k *a)
{
    void (*blk_dot)(const uint8_t *, const struct act_q8k *, int *, int *) =
        kt == KT_Q2_K   ? kq_q2_K
        : kt == KT_Q3_K ? kq_q3_K
        : kt == KT_Q4_K ? kq_q4_K
        : kt == KT_Q5_K ? kq_q5_K
        : kt == KT_Q6_K ? kq_q6_K
                        : kq_iq4_xs;
    int isum, msum;
    float d, dmin;
    blk_dot(blk, a, &isum, &msum);
    kq_scales(kt, blk, &d, &dmin);
    return d * a->d * (float)isum - dmin * a->d * (float)msum;
}

static void kquant_tile_scalar(int kt, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                               size_t xs, int nt, int cols, float *y, size_t ys)
{
    const size_t bb = ws / (size_t)(cols / QK_K); /* bytes per super-block */
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / QK_K; b++) s += kquant_block(kt, w + r * ws + b * bb, &a[b]);
            y[t * ys + r] = s;
        }
}

/* The 16-row records (repack.h): each row's block taken back out, then the row kernel's
 * arithmetic, so a repacked tensor gives the row layout's results bit for bit. */
static void kquant_x16_tile_scalar(int kt, uint32_t type, const uint8_t *w, size_t ws, int nr,
                                   const uint8_t *x, size_t xs, int nt, int cols, float *y,
                                   size_t ys)
{
    const size_t bb = ws / (size_t)(cols / QK_K);
    uint8_t blk[512];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *g = w + (size_t)(r / REPACK_ROWS) * REPACK_ROWS * ws;
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / QK_K; b++) {
                repack_unpack(type, g + (size_t)b * bb * REPACK_ROWS, r % REPACK_ROWS, blk);
                s += kquant_block(kt, blk, &a[b]);
            }
            y[t * ys + r] = s;
        }
}

/* The 16-row records of the nibble formats against act_q8: each row's block taken back out, then
 * its integer dot and the row kernel's float terms (act_q8 carries what act_q4 does). */
static void nibble_x16_tile_scalar(int kt, uint32_t type, const uint8_t *w, size_t ws, int nr,
                                   const uint8_t *x, size_t xs, int nt, int cols, float *y,
                                   size_t ys)
{
    const size_t bb = ws / (size_t)(cols / 32);
    uint8_t blk[64];
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            const uint8_t *g = w + (size_t)(r / REPACK_ROWS) * REPACK_ROWS * ws;
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs);
            float s = 0;
            for (int b = 0; b < cols / 32; b++) {
                repack_unpack(type, g + (size_t)b * bb * REPACK_ROWS, r % REPACK_ROWS, blk);
                int q[32], dot = 0;
                nibble_quants(kt, blk, 0, q);
                for (int j = 0; j < 32; j++) dot += q[j] * a[b].qs[j];
                const uint16_t *dm = (const uint16_t *)blk;
                s += fp16_to_f32(dm[0]) * a[b].d * (float)dot;
                if (kt == KT_Q4_1 || kt == KT_Q5_1) s += fp16_to_f32(dm[1]) * a[b].s;
            }
            y[t * ys + r] = s;
        }
}

#define NIBBLE_X16_SCALAR(name, KT, TYPE)                                                          \
    static void tile_##name##_x16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x,    \
                                         size_t xs, int nt, int cols, float *y, size_t ys)         \
    {                                                                                              \
        nibble_x16_tile_scalar(KT, TYPE, w, ws, nr, x, xs, nt, cols, y, ys);                       \
    }
NIBBLE_X16_SCALAR(q4_1, KT_Q4_1, TENSOR_Q4_1_X16)
NIBBLE_X16_SCALAR(q5_0, KT_Q5_0, TENSOR_Q5_0_X16)
NIBBLE_X16_SCALAR(q5_1, KT_Q5_1, TENSOR_Q5_1_X16)
NIBBLE_X16_SCALAR(iq4_nl, KT_IQ4_NL, TENSOR_IQ4_NL_X16)
#undef NIBBLE_X16_SCALAR

#define KQUANT_X16_SCALAR(name, KT, TYPE)                                                          \
    static void tile_##name##_x16_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x,    \
                                         size_t xs, int nt, int cols, float *y, size_t ys)         \
    {                                                                                              \
        kquant_x16_tile_scalar(KT, TYPE, w, ws, nr, x, xs, nt, cols, y, ys);                       \
    }
KQUANT_X16_SCALAR(q2_K, KT_Q2_K, TENSOR_Q2_K_X16)
KQUANT_X16_SCALAR(q3_K, KT_Q3_K, TENSOR_Q3_K_X16)
KQUANT_X16_SCALAR(q4_K, KT_Q4_K, TENSOR_Q4_K_X16)
KQUANT_X16_SCALAR(q5_K, KT_Q5_K, TENSOR_Q5_K_X16)
KQUANT_X16_SCALAR(q6_K, KT_Q6_K, TENSOR_Q6_K_X16)
KQUANT_X16_SCALAR(iq4_xs, KT_IQ4_XS, TENSOR_IQ4_XS_X16)
#undef KQUANT_X16_SCALAR

#define KQUANT_SCALAR(name, KT)                                                                    \
    static void tile_##name##_scalar(const uint8_t *w, size_t ws, int nr, const uint8_t *x,        \
                                     size_t xs, int nt, int cols, float *y, size_t ys)             \
    {                                                                                              \
        kquant_tile_scalar(KT, w, ws, nr, x, xs, nt, cols, y, ys);                                 \
    }
KQUANT_SCALAR(q2_K, KT_Q2_K)
KQUANT_SCALAR(q4_K, KT_Q4_K)
KQUANT_SCALAR(q3_K, KT_Q3_K)
KQUANT_SCALAR(q5_K, KT_Q5_K)
KQUANT_SCALAR(q6_K, KT_Q6_K)
KQUANT_SCALAR(iq4_xs, KT_IQ4_XS)
#undef KQUANT_SCALAR

const struct kernel_table kernels_scalar = {
    .name = "scalar",
    .tile_t = 4,
    .tile = {[KT_F32] = tile_f32_scalar,
             [KT_F16] = tile_f16_scalar,
             [KT_BF16] = tile_bf16_scalar,
             [KT_Q8_0] = tile_q8_0_scalar,
             [KT_Q4_0] = tile_q4_0_scalar,
             [KT_Q4_1] = tile_q4_1_scalar,
             [KT_Q5_0] = tile_q5_0_scalar,
             [KT_Q5_1] = tile_q5_1_scalar,
             [KT_IQ4_NL] = tile_iq4_nl_scalar,
             [KT_Q2_K] = tile_q2_K_scalar,
             [KT_Q3_K] = tile_q3_K_scalar,
             [KT_Q4_K] = tile_q4_K_scalar,
             [KT_Q5_K] = tile_q5_K_scalar,
             [KT_Q6_K] = tile_q6_K_scalar,
             [KT_IQ4_XS] = tile_iq4_xs_scalar,
             [KT_Q8_0_X16] = tile_q8_0_x16_scalar,
             [KT_Q4_0_X16] = tile_q4_0_x16_scalar,
             [KT_Q4_1_X16] = tile_q4_1_x16_scalar,
             [KT_Q5_0_X16] = tile_q5_0_x16_scalar,
             [KT_Q5_1_X16] = tile_q5_1_x16_scalar,
             [KT_IQ4_NL_X16] = tile_iq4_nl_x16_scalar,
             [KT_Q2_K_X16] = tile_q2_K_x16_scalar,
             [KT_Q3_K_X16] = tile_q3_K_x16_scalar,
             [KT_Q4_K_X16] = tile_q4_K_x16_scalar,
             [KT_Q5_K_X16] = tile_q5_K_x16_scalar,
             [KT_Q6_K_X16] = tile_q6_K_x16_scalar,
             [KT_IQ4_XS_X16] = tile_iq4_xs_x16_scalar},
    .quant_q8 = quantize_act_q8,
    .quant_q8k = quantize_act_q8k,
    .quant_q4 = quantize_act_q4,
};

/* ---- ISA choice ----------------------------------------------------------------------------- */

/* Each architecture's tables, lowest first, and whether this CPU runs each (NULL: always). */
#if defined(__x86_64__)
#include <cpuid.h>

static int have_f16c(void)
{
    /* cpuid, not __builtin_cpu_supports: clang 14 does not know "f16c". */
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int have_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && have_f16c();
}

static int have_avx512(void)
{
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

/* AVX-VNNI (the VEX vpdpbusd): CPUID leaf 7 subleaf 1, EAX bit 4 (GCC 12's cpu_supports lacks
 * the name). */
static int have_avxvnni(void)
{
    unsigned a, b, c, d;
    return have_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}

const struct kernel_table *const kernel_tables[] = {&kernels_scalar, &kernels_avx2,
                                                    &kernels_avxvnni, &kernels_avx512};
static int (*const kernel_have[])(void) = {NULL, have_avx2, have_avxvnni, have_avx512};
#elif defined(__aarch64__)
#include <sys/auxv.h>

/* Advanced SIMD is in every aarch64 CPU; the dot-product instructions (Armv8.2's optional
 * FEAT_DotProd: Neoverse N1/V1/V2, Cortex-A76 on) and the int8 matrix multiply (FEAT_I8MM:
 * Neoverse V1/V2) are reported by the kernel in AT_HWCAP and AT_HWCAP2. */
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
static int have_dotprod(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}

static int have_i8mm(void)
{
    return have_dotprod() && (getauxval(AT_HWCAP2) & HWCAP2_I8MM) != 0;
}

const struct kernel_table *const kernel_tables[] = {&kernels_scalar, &kernels_neon,
                                                    &kernels_dotprod, &kernels_i8mm};
static int (*const kernel_have[])(void) = {NULL, NULL, have_dotprod, have_i8mm};
#else
const struct kernel_table *const kernel_tables[] = {&kernels_scalar};
static int (*const kernel_have[])(void) = {NULL};
#endif
const int kernel_tables_n = sizeof kernel_tables / sizeof *kernel_tables;

/* The best table this CPU runs, or the best up to the one STRATA_ISA names (a lower one when the
 * CPU lacks it; an unknown name limits nothing). */
static const struct kernel_table *choose_kernels(void)
{
    pthread_once(&f16_table_once, f16_table_fill);
    const char *want = getenv("STRATA_ISA");
    int limit = kernel_tables_n - 1;
    for (int i = 0; want && i < kernel_tables_n; i++)
        if (!strcmp(want, kernel_tables[i]->name)) limit = i;
    for (int i = limit; i > 0; i--)
        if (!kernel_have[i] || kernel_have[i]()) return kernel_tables[i];
    return &kernels_scalar;
}

const char *matmul_isa(void)
{
    return choose_kernels()->name;
}

int matmul_wants_repack(const struct matmul_ctx *k, const struct tensor *t)
{
    const struct kernel_table *kt = k->kernels ? k->kernels : choose_kernels();
    return repack_eligible(t) && t->type < 32 && (kt->repack_types >> t->type & 1);
}

const char *matmul_isa_of(const struct matmul_ctx *k)
{
    return k->kernels ? k->kernels->name : matmul_isa();
}

/* ---- driver --------------------------------------------------------------------------------- */

size_t matmul_scratch_size(int max_tokens, int max_cols)
{
    size_t cols = ((size_t)max_cols + QK_K - 1) / QK_K * QK_K;
    size_t per_tok = act_bytes(1, (int)cols);
    for (int fmt = 2; fmt <= 3; fmt++)
        if (act_bytes(fmt, (int)cols) > per_tok) per_tok = act_bytes(fmt, (int)cols);
    return (size_t)max_tokens * per_tok;
}

int matmul_init(struct matmul_ctx *k, struct threadpool *tp, void *scratch, int max_tokens,
                int max_cols, char *err)
{
    memset(k, 0, sizeof *k);
    if (max_tokens < 1 || max_cols < 1) {
        errmsg_set(err, "matmul: max_tokens %d and max_cols %d must be positive", max_tokens,
                   max_cols);
        return -1;
    }
    size_t need = matmul_scratch_size(max_tokens, max_cols);
    if (need && !scratch) {
        errmsg_set(err, "matmul: no scratch buffer (%zu bytes needed)", need);
        return -1;
    }
    k->tp = tp;
    k->scratch = scratch;
    k->scratch_size = need;
    k->max_tokens = max_tokens;
    k->max_cols = max_cols;
    k->kernels = choose_kernels();
    return 0;
}

struct mm_job {
    const struct kernel_table *kt;
    int n;
    float *const *y;
    const struct tensor *const *w;
    const uint8_t *x; /* floats or quantized activations */
    size_t xs;        /* bytes per token in x */
    int n_tok, total_rows;
};

/* Part ith of nth: an equal share of the rows of all matrices together. A part walks its rows in
 * chunks of about 64 KiB of weights; for each chunk it runs every tile of tokens, so for
 * n_tok > 1 the chunk is read from memory once and then from L2, while the tile's activations
 * stay in L1. For n_tok = 1 this is one sequential pass over the part's rows. */
static void mm_worker(void *arg, int ith, int nth)
{
    const struct mm_job *j = arg;
    int row = (int)((long long)j->total_rows * ith / nth);
    int end = (int)((long long)j->total_rows * (ith + 1) / nth);
    int base = 0;
    for (int m = 0; m < j->n && row < end; base += j->w[m]->rows, m++) {
        const struct tensor *w = j->w[m];
        int rows = w->rows, g = row_group(w->type);
        /* This part's rows of matrix m; both ends rounded down to the matrix's row group, the
         * same way by every part, so the parts still tile it. */
        int lo = row - base, hi = end - base;
        lo = lo < 0 ? 0 : lo > rows ? rows : lo / g * g;
        hi = hi >= rows ? rows : hi < 0 ? 0 : hi / g * g;
        if (lo >= hi) continue;
        int kt = kernel_type(w->type);
        if (kt < 0) abort(); /* model_plan admits only the types above */
        tile_fn fn = j->kt->tile[kt];
        size_t ws = row_bytes(w->type, w->cols);
        int chunk = ws >= 65536 ? 1 : (int)(65536 / ws);
        chunk = chunk < g ? g : chunk / g * g;
        int tt = j->kt->tile_t;
        for (int r = lo, nr; r < hi; r += nr) {
            nr = hi - r < chunk ? hi - r : chunk;
            for (int t = 0; t < j->n_tok; t += tt) {
                int nt = j->n_tok - t < tt ? j->n_tok - t : tt;
                fn((const uint8_t *)w->data + (size_t)r * ws, ws, nr, j->x + (size_t)t * j->xs,
                   j->xs, nt, w->cols, j->y[m] + (size_t)t * rows + r, (size_t)rows);
            }
        }
    }
}

struct quant_job {
    const struct kernel_table *kt;
    int fmt, cols, n_tok;
    const float *x;
    uint8_t *out;
    size_t xs;
};

static void quant_worker(void *arg, int ith, int nth)
{
    const struct quant_job *q = arg;
    for (int t = ith; t < q->n_tok; t += nth)
        quantize_act(q->kt, q->fmt, q->x + (size_t)t * q->cols, q->out + (size_t)t * q->xs,
                     q->cols);
}

void matmul_multi(struct matmul_ctx *k, int n, float *const *y, const struct tensor *const *w,
                  const float *x, int n_tok)
{
    if (n < 1 || n_tok < 1) return;
    int fmt = act_format(w[0]->type), total = 0;
    for (int i = 0; i < n; i++) {
        if (act_format(w[i]->type) != fmt) { /* mixed formats: one dispatch per matrix */
            for (int m = 0; m < n; m++) matmul_multi(k, 1, &y[m], &w[m], x, n_tok);
            return;
        }
        total += w[i]->rows;
    }
    const struct kernel_table *kt = k->kernels ? k->kernels : choose_kernels();
    int cols = w[0]->cols;
    struct mm_job job = {kt,    n,    y, w, (const uint8_t *)x, (size_t)cols * sizeof(float),
                         n_tok, total};
    if (fmt) {
        /* The forward pass sizes the scratch from max_tokens/max_cols; exceeding it is a bug. */
        if (n_tok > k->max_tokens || cols > k->max_cols) abort();
        struct quant_job q = {kt, fmt, cols, n_tok, x, k->scratch, act_bytes(fmt, cols)};
        if (n_tok == 1 || !k->tp)
            quant_worker(&q, 0, 1);
        else
            threadpool_run(k->tp, quant_worker, &q);
        job.x = k->scratch;
        job.xs = q.xs;
    }
    /* Parts of contiguous rows, a few per thread: threads that the OS slows down (or that start
     * late) take fewer of them, so nobody waits for a straggler's fixed share. */
    int parts = k->tp ? 4 * threadpool_size(k->tp) : 1;
    if (parts > total) parts = total;
    if (parts > 1)
        threadpool_run_parts(k->tp, mm_worker, &job, parts);
    else
        mm_worker(&job, 0, 1);
}

void matmul(struct matmul_ctx *k, float *y, const struct tensor *w, const float *x, int n_tok)
{
    matmul_multi(k, 1, &y, &w, x, n_tok);
}

void tensor_get_row(const struct tensor *w, int row, float *out)
{
    if (repack_base_type(w->type) != w->type) {
        repack_dequantize_row(w, row, out);
        return;
    }
    size_t rb = row_bytes(w->type, w->cols);
    dequantize_row(w->type, (const uint8_t *)w->data + (size_t)row * rb, out, w->cols);
}
