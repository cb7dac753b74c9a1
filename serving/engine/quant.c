/* quant: conversions and the reference (de)quantizers, in plain C.
 *
 * Bit-exactness with ggml is the point: a model quantized here must be byte for byte the file
 * llama.cpp's converter writes from the same floats, so the arithmetic below keeps ggml's order
 * of float operations (and this file is compiled without FMA contraction: -std=c11 implies
 * -ffp-contract=off in GCC). The SIMD kernels in matmul_*.c never quantize weights; they only
 * read these formats. */
#include "serving/engine/quant.h"

#include "serving/engine/gguf.h"

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

/* ---- Q4_K ------------------------------------------------------------------------------------
 * A super-block of 256 is 8 sub-blocks of 32, each x ~ d*sc*q - dmin*m with q in 0..15 and
 * 6-bit sc, m. The 12 scale bytes hold sub-blocks 0-3 in the low 6 bits of bytes 0-3 (sc) and 4-7
 * (m); sub-blocks 4-7 keep their low 4 bits in bytes 8-11 (sc low nibble, m high nibble) and their
 * top 2 bits in the spare top bits of bytes 0-3 (sc) and 4-7 (m). qs holds 4 groups of 64:
 * byte l of group g has element 64g+l in its low nibble and 64g+32+l in its high nibble. */

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5*2^23 puts the integer in the low
 * mantissa bits (the float addition does the rounding), the same trick as ggml's nearest_int. */
static inline int round_even(float v)
{
    float t = v + 12582912.f;
    uint32_t i = f32_bits(t);
    return (int)(i & 0x007fffff) - 0x00400000;
}

void q4_K_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static inline uint8_t clamp_u(int v, int hi)
{
    return (uint8_t)(v < 0 ? 0 : v > hi ? hi : v);
}

/* Fit x ~ scale*L + min (min <= 0) over one sub-block of 32 with weights w, by trying a grid of
 * inverse scales around nmax/(max-min) and solving weighted least squares for (scale, min) at
 * each; keeps the best weighted squared error. Returns scale, stores -min in *neg_min. This is
 * ggml's make_qkx2_quants with rmin=-1, rdelta=0.1, nstep=20, squared error. */
static float fit_scale_min(const float *x, const float *w, uint8_t *L, float *neg_min)
{
    const int n = 32, nmax = 15, nstep = 20;
    const float rmin = -1.0f, rdelta = 0.1f;
    uint8_t Laux[32];
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = clamp_u(round_even(iscale * (x[i] - min)), nmax);
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_u(round_even(iscale * (x[i] - min)), nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, n);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

static void quantize_q4_K(const float *x, struct block_q4_K *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[8], mins[8], w[32];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            const float *xs = x + 32 * j;
            /* Weights favour large elements on top of the sub-block's RMS (ggml's choice). */
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
            scales[j] = fit_scale_min(xs, w, L + 32 * j, &mins[j]);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        memset(y[i].scales, 0, sizeof y[i].scales);
        for (int j = 0; j < 8; j++) {
            /* ggml stores nearest_int's result in a uint8_t before clamping to 63. */
            uint8_t ls = (uint8_t)round_even(inv_scale * scales[j]);
            uint8_t lm = (uint8_t)round_even(inv_min * mins[j]);
            if (ls > 63) ls = 63;
            if (lm > 63) lm = 63;
            if (j < 4) {
                y[i].scales[j] = ls;
                y[i].scales[j + 4] = lm;
            } else {
                y[i].scales[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
                y[i].scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                y[i].scales[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        y[i].d = f32_to_fp16(max_scale / 63.f);
        y[i].dmin = f32_to_fp16(max_min / 63.f);
        /* Requantize against the scales as stored (6-bit, f16), not the fitted floats. */
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4_K_scale_min(j, y[i].scales, &sc, &m);
            const float d = fp16_to_f32(y[i].d) * sc;
            if (!d) continue;
            const float dm = fp16_to_f32(y[i].dmin) * m;
            for (int l = 0; l < 32; l++)
                L[32 * j + l] = clamp_u(round_even((x[32 * j + l] + dm) / d), 15);
        }
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

static void dequantize_q4_K(const struct block_q4_K *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            q4_K_scale_min(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4_K_scale_min(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t *q = b[i].qs + 32 * g;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xf) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* ---- dispatch ------------------------------------------------------------------------------- */

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
    case GGML_Q8_0:
        if (n % QK8_0) return -1;
        quantize_q8_0(x, out, n / QK8_0);
        return 0;
    case GGML_Q4_0:
        if (n % QK4_0) return -1;
        quantize_q4_0(x, out, n / QK4_0);
        return 0;
    case GGML_Q4_K:
        if (n % QK_K) return -1;
        quantize_q4_K(x, out, n / QK_K);
        return 0;
    }
    return -1;
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
    case GGML_Q8_0:
        if (n % QK8_0) return -1;
        dequantize_q8_0(in, out, n / QK8_0);
        return 0;
    case GGML_Q4_0:
        if (n % QK4_0) return -1;
        dequantize_q4_0(in, out, n / QK4_0);
        return 0;
    case GGML_Q4_K:
        if (n % QK_K) return -1;
        dequantize_q4_K(in, out, n / QK_K);
        return 0;
    }
    return -1;
}
