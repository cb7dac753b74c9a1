/* quant: conversions, the blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and the dispatch; the
 * super-blocks are in quant_kquants.c, IQ4_NL/IQ4_XS in quant_iq4.c.
 *
 * Bit-exactness with ggml is the point: a model quantized here must be byte for byte the file
 * llama.cpp's quantizer writes from the same floats, so the arithmetic keeps ggml's order of
 * float operations (and these files are compiled without FMA contraction: -std=c11 implies
 * -ffp-contract=off in GCC), and dequantization evaluates ggml's expressions in ggml's order. The
 * SIMD kernels in matmul_*.c never quantize weights; they only read these formats. */
#include "serving/engine/quant.h"

#include "serving/engine/gguf.h"
#include "serving/engine/quant_blocks.h"

#include <float.h>

#include <math.h>
#include <string.h>

/* ---- scalar conversions --------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        /* Subnormal half: shift the mantissa up until its leading 1 becomes the implicit bit. */
        uint32_t e = 127 - 15 + 1;
        while (!(mant & 0x400)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ff) << 13));
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000 | (mant << 13));
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t f32_to_fp16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00; /* NaN: the quiet NaN ggml writes */
    if (a >= 0x38800000) {                    /* |f| >= 2^-14: a normal half, or overflow */
        uint32_t m = a - ((uint32_t)(127 - 15) << 23);
        m = (m + 0xfff + ((m >> 13) & 1)) >> 13; /* round to nearest even; carries into exp */
        return sign | (uint16_t)(m >= 0x7c00 ? 0x7c00 : m);
    }
    /* Subnormal half (or zero): q = |f| * 2^24, rounded to nearest even. */
    uint32_t e = a >> 23;
    if (e < 102) return sign; /* |f| < 2^-25: rounds to zero (2^-25 itself is a tie to 0) */
    uint32_t full = (a & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14 .. 24 */
    uint32_t q = full >> shift;
    uint32_t rem = full & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* keep NaN quiet */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- Q8_0 and Q4_0 -------------------------------------------------------------------------- */

static void quantize_q8_0(const float *x, struct block_q8_0 *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void dequantize_q8_0(const struct block_q8_0 *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) *y++ = b[i].qs[j] * d;
    }
}

static void quantize_q4_0(const float *x, struct block_q4_0 *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK4_0) {
        /* The scale comes from the signed value of largest magnitude, so that value maps to
         * exactly -8 and the other side gets the 8th step (+7 only reaches 7/8 of it). */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            /* Truncation of x/d + 8.5 is rounding half up; the int8 cast is ggml's. */
            int q0 = (int8_t)(x[j] * id + 8.5f), q1 = (int8_t)(x[j + QK4_0 / 2] * id + 8.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void dequantize_q4_0(const struct block_q4_0 *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++, y += QK4_0) {
        const float d = fp16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = ((b[i].qs[j] & 0xf) - 8) * d;
            y[j + QK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ---- Q4_1, Q5_0, Q5_1 ----------------------------------------------------------------------- */

/* Q4_1 and Q5_1 span [min, max] in 2^bits - 1 steps. The float -> int8/uint8 casts truncate
 * x/d + 0.5 (rounding half up), as ggml's do. */
static void quantize_q4_1(const float *x, struct block_q4_1 *y, int nb)
{
    for (int i = 0; i < nb; i++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(min);
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)((x[j] - min) * id + 0.5f),
                q1 = (int8_t)((x[j + 16] - min) * id + 0.5f);
            if (q0 > 15) q0 = 15;
            if (q1 > 15) q1 = 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Q5_0: like Q4_0 with 16 steps each side (the extreme maps to -16). */
static void quantize_q5_0(const float *x, struct block_q5_0 *y, int nb)
{
    for (int i = 0; i < nb; i++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int q0 = (int8_t)(x[j] * id + 16.5f), q1 = (int8_t)(x[j + 16] * id + 16.5f);
            if (q0 > 31) q0 = 31;
            if (q1 > 31) q1 = 31;
            y[i].qs[j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void quantize_q5_1(const float *x, struct block_q5_1 *y, int nb)
{
    for (int i = 0; i < nb; i++, x += 32) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < 32; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_fp16(d);
        y[i].m = f32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            /* No clamp: (x - min)/d + 0.5 < 31.5 (ggml clamps neither). */
            uint8_t q0 = (uint8_t)((x[j] - min) * id + 0.5f);
            uint8_t q1 = (uint8_t)((x[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
            qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
        }
        memcpy(y[i].qh, &qh, 4);
    }
}

static void dequantize_q4_1(const struct block_q4_1 *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (b[i].qs[j] & 0xf) * d + m;
            y[j + 16] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

/* The 5-bit quants of a Q5_0/Q5_1 block, 0..31. */
static void q5_quants(const uint8_t *qs, const uint8_t *qh_bytes, int *q)
{
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

static void dequantize_q5_0(const struct block_q5_0 *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_f32(b[i].d);
        int q[32];
        q5_quants(b[i].qs, b[i].qh, q);
        for (int j = 0; j < 32; j++) y[j] = (q[j] - 16) * d;
    }
}

static void dequantize_q5_1(const struct block_q5_1 *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
        int q[32];
        q5_quants(b[i].qs, b[i].qh, q);
        for (int j = 0; j < 32; j++) y[j] = q[j] * d + m;
    }
}

/* ---- dispatch ------------------------------------------------------------------------------- */

typedef void (*quantize_fn)(const float *x, void *y, int nb);
typedef void (*dequantize_fn)(const void *b, float *y, int nb);

/* Each format's pair behind one signature (calls through a cast pointer would be undefined). */
#define WRAP(name, blk)                                                                            \
    static void qw_##name(const float *x, void *y, int nb)                                         \
    {                                                                                              \
        quantize_##name(x, (struct blk *)y, nb);                                                   \
    }                                                                                              \
    static void dw_##name(const void *b, float *y, int nb)                                         \
    {                                                                                              \
        dequantize_##name((const struct blk *)b, y, nb);                                           \
    }
WRAP(q8_0, block_q8_0)
WRAP(q4_0, block_q4_0)
WRAP(q4_1, block_q4_1)
WRAP(q5_0, block_q5_0)
WRAP(q5_1, block_q5_1)
WRAP(iq4_nl, block_iq4_nl)
WRAP(q2_K, block_q2_K)
WRAP(q3_K, block_q3_K)
WRAP(q4_K, block_q4_K)
WRAP(q5_K, block_q5_K)
WRAP(q6_K, block_q6_K)
WRAP(iq4_xs, block_iq4_xs)
#undef WRAP

/* The block formats: elements per block, quantizer, dequantizer. */
static const struct block_format {
    uint32_t type;
    int block;
    quantize_fn quantize;
    dequantize_fn dequantize;
} formats[] = {
#define FMT(T, blk, name)                                                                          \
    {                                                                                              \
        T, blk, qw_##name, dw_##name                                                               \
    }
    FMT(GGML_Q8_0, 32, q8_0),   FMT(GGML_Q4_0, 32, q4_0),   FMT(GGML_Q4_1, 32, q4_1),
    FMT(GGML_Q5_0, 32, q5_0),   FMT(GGML_Q5_1, 32, q5_1),   FMT(GGML_IQ4_NL, 32, iq4_nl),
    FMT(GGML_Q2_K, QK_K, q2_K), FMT(GGML_Q3_K, QK_K, q3_K), FMT(GGML_Q4_K, QK_K, q4_K),
    FMT(GGML_Q5_K, QK_K, q5_K), FMT(GGML_Q6_K, QK_K, q6_K), FMT(GGML_IQ4_XS, QK_K, iq4_xs),
#undef FMT
};

static const struct block_format *format_of(uint32_t type)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == type) return &formats[i];
    return NULL;
}

int quant_type_supported(uint32_t type)
{
    return type == GGML_F32 || type == GGML_F16 || type == GGML_BF16 || format_of(type);
}

const char *quant_type_list(void)
{
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, "
           "iq4_xs";
}

int quantize_row(uint32_t type, const float *x, void *out, int n)
{
    if (n < 0) return -1;
    switch (type) {
    case GGML_F32:
        memcpy(out, x, (size_t)n * sizeof(float));
        return 0;
    case GGML_F16:
    case GGML_BF16: {
        uint16_t *h = out;
        for (int i = 0; i < n; i++) h[i] = type == GGML_F16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i]);
        return 0;
    }
    }
    const struct block_format *f = format_of(type);
    if (!f || n % f->block) return -1;
    f->quantize(x, out, n / f->block);
    return 0;
}

int dequantize_row(uint32_t type, const void *in, float *out, int n)
{
    if (n < 0) return -1;
    switch (type) {
    case GGML_F32:
        memcpy(out, in, (size_t)n * sizeof(float));
        return 0;
    case GGML_F16:
    case GGML_BF16: {
        const uint16_t *h = in;
        for (int i = 0; i < n; i++)
            out[i] = type == GGML_F16 ? fp16_to_f32(h[i]) : bf16_to_f32(h[i]);
        return 0;
    }
    }
    const struct block_format *f = format_of(type);
    if (!f || n % f->block) return -1;
    f->dequantize(in, out, n / f->block);
    return 0;
}
