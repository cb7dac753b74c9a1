/* quant_kquants: the K-quant super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), quantized as ggml's
 * reference quantizers do (what llama-quantize writes without an importance matrix) and
 * dequantized with ggml's expressions, in ggml's order of float operations (see quant.c). The
 * layouts are described in quant.h. */
#include "serving/engine/quant.h"

#include "serving/engine/quant_blocks.h"

#include <math.h>
#include <string.h>

/* Below this a group is all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_MAX_EPS 1e-15f

static inline int clamp_i(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- fitting helpers ------------------------------------------------------------------------ */

/* Symmetric levels -nmax..nmax-1 for n values: the scale that maximizes the weighted fit
 * (weights x^2) over a grid of 19 inverse scales around -nmax/max (max: the signed value of
 * largest magnitude). L gets level + nmax. ggml's make_qx_quants with rmse_type 1, no weights. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_i(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_i(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_i(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's sub-block fit: levels -nmax..nmax-1 from -nmax/max, then up to 5 rounds of moving one
 * level at a time while the weighted (x^2) fit improves. L gets level + nmax. ggml's
 * make_q3_quants with do_rmse. */
static float fit_q3(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clamp_i(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = clamp_i(quant_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Fit x ~ scale*L + min (min <= 0, L in 0..nmax) with weights w: a grid of nstep+1 inverse
 * scales (rmin + rdelta*is + nmax)/(max - min), weighted least squares for (scale, min) at each,
 * keeping the smallest weighted error (absolute if use_mad, else squared). Returns scale, stores
 * -min in *neg_min. ggml's make_qkx2_quants. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, float rmin, float rdelta, int nstep, int use_mad)
{
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
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_i(quant_nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clamp_i(quant_nearest_int(iscale * (x[i] - min)), 0, nmax);
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
                diff = use_mad ? fabsf(diff) : diff * diff;
                err += w[i] * diff;
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* 2-bit quants of 256 elements into 64 bytes: element 128h + 32s + l -> bits 2s of q[32h + l]. */
static void pack_2bit(const uint8_t *L, uint8_t *q)
{
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            q[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                     (L[j + l + 96] << 6));
}

/* ---- Q2_K ----------------------------------------------------------------------------------- */

void quantize_q2_K(const float *x, struct block_q2_K *y, int nb)
{
    const float q4scale = 15.f;
    for (int i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float mins[16], scales[16], w[16];
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] =
                fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] = (uint8_t)quant_nearest_int(iscale * scales[j]);
            y[i].d = f32_to_fp16(max_scale / q4scale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = f32_to_fp16(0.f);
        }
        if (max_min > 0) {
            float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++)
                y[i].scales[j] |= (uint8_t)(quant_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f32_to_fp16(max_min / q4scale);
        } else
            y[i].dmin = f32_to_fp16(0.f);
        for (int j = 0; j < 16; j++) {
            const float d = fp16_to_f32(y[i].d) * (y[i].scales[j] & 0xf);
            if (!d) continue;
            const float dm = fp16_to_f32(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clamp_i(quant_nearest_int((x[16 * j + l] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

void dequantize_q2_K(const struct block_q2_K *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d), min = fp16_to_f32(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int s = (e % 128) / 32, l = e % 32;
            const uint8_t sc = b[i].scales[e / 16];
            const float dl = d * (sc & 0xf), ml = min * (sc >> 4);
            *y++ = dl * ((b[i].qs[32 * (e / 128) + l] >> (2 * s)) & 3) - ml;
        }
    }
}

/* ---- Q3_K ----------------------------------------------------------------------------------- */

int q3_K_scale(int j, const uint8_t *s)
{
    int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    return lo | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

void quantize_q3_K(const float *x, struct block_q3_K *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale) {
            float iscale = -32.f / max_scale;
            for (int j = 0; j < 16; j++) {
                /* ggml keeps the level in an int8_t; |iscale * scale| <= 32, so it fits. */
                int l = clamp_i((int8_t)quant_nearest_int(iscale * scales[j]), -32, 31) + 32;
                if (j < 8)
                    y[i].scales[j] = (uint8_t)(l & 0xf);
                else
                    y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
                y[i].scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y[i].d = f32_to_fp16(1 / iscale);
        } else
            y[i].d = f32_to_fp16(0.f);
        for (int j = 0; j < 16; j++) {
            const float d = fp16_to_f32(y[i].d) * (q3_K_scale(j, y[i].scales) - 32);
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clamp_i(quant_nearest_int(x[16 * j + l] / d), -4, 3) + 4);
        }
        /* The high bit of element e goes to bit e / 32 of hmask[e % 32]. */
        memset(y[i].hmask, 0, sizeof y[i].hmask);
        uint8_t L2[QK_K];
        for (int e = 0; e < QK_K; e++) {
            int l = L[e];
            if (l > 3) {
                y[i].hmask[e % 32] |= (uint8_t)(1 << (e / 32));
                l -= 4;
            }
            L2[e] = (uint8_t)l;
        }
        pack_2bit(L2, y[i].qs);
    }
}

void dequantize_q3_K(const struct block_q3_K *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d_all = fp16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const int s = (e % 128) / 32, l = e % 32;
            const float dl = d_all * (q3_K_scale(e / 16, b[i].scales) - 32);
            int q = (b[i].qs[32 * (e / 128) + l] >> (2 * s)) & 3;
            q -= b[i].hmask[l] >> (e / 32) & 1 ? 0 : 4;
            *y++ = dl * q;
        }
    }
}

/* ---- Q4_K and Q5_K ---------------------------------------------------------------------------
 * 8 sub-blocks of 32 with 6-bit scales and mins (q4_K_scale_min). */

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

/* The common part of Q4_K and Q5_K: fit each sub-block (levels 0..nmax), store the 6-bit scales
 * and mins and the f16 d, dmin, and requantize L against the scales as stored. */
static void kquant_scales_mins(const float *x, int nmax, float rmin, int nstep, uint8_t *scales,
                               uint16_t *dh, uint16_t *dminh, uint8_t *L)
{
    float sc[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        /* Weights favour large elements on top of the sub-block's RMS (ggml's choice). */
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        sc[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], rmin, 0.1f, nstep, 0);
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        /* ggml stores nearest_int's result in a uint8_t before clamping to 63. */
        uint8_t ls = (uint8_t)quant_nearest_int(inv_scale * sc[j]);
        uint8_t lm = (uint8_t)quant_nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *dh = f32_to_fp16(max_scale / 63.f);
    *dminh = f32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        q4_K_scale_min(j, scales, &s, &m);
        const float d = fp16_to_f32(*dh) * s;
        if (!d) continue;
        const float dm = fp16_to_f32(*dminh) * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clamp_i(quant_nearest_int((x[32 * j + l] + dm) / d), 0, nmax);
    }
}

void quantize_q4_K(const float *x, struct block_q4_K *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        kquant_scales_mins(x, 15, -1.f, 20, y[i].scales, &y[i].d, &y[i].dmin, L);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
    }
}

void quantize_q5_K(const float *x, struct block_q5_K *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        kquant_scales_mins(x, 31, -0.5f, 15, y[i].scales, &y[i].d, &y[i].dmin, L);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int l1 = L[64 * g + l], l2 = L[64 * g + 32 + l];
                y[i].qh[l] |= (uint8_t)((l1 >> 4) << (2 * g) | (l2 >> 4) << (2 * g + 1));
                y[i].qs[32 * g + l] = (uint8_t)((l1 & 0xf) | ((l2 & 0xf) << 4));
            }
    }
}

void dequantize_q4_K(const struct block_q4_K *b, float *y, int nb)
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

void dequantize_q5_K(const struct block_q5_K *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
        for (int g = 0; g < 4; g++) {
            uint8_t sc, m;
            q4_K_scale_min(2 * g, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            q4_K_scale_min(2 * g + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            const uint8_t *q = b[i].qs + 32 * g, *qh = b[i].qh;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] & 0xf) + (qh[l] >> (2 * g) & 1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((q[l] >> 4) + (qh[l] >> (2 * g + 1) & 1 ? 16 : 0)) - m2;
        }
    }
}

/* ---- Q6_K ----------------------------------------------------------------------------------- */

void quantize_q6_K(const float *x, struct block_q6_K *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0, max_abs_scale = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -128.f / max_scale;
        y[i].d = f32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++) {
            int l = quant_nearest_int(iscale * scales[j]);
            y[i].scales[j] = (int8_t)(l < 127 ? l : 127);
        }
        for (int j = 0; j < 16; j++) {
            const float d = fp16_to_f32(y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] =
                    (int8_t)(clamp_i(quant_nearest_int(x[16 * j + l] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xf) | (Lh[l + 64] & 0xf) << 4);
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xf) | (Lh[l + 96] & 0xf) << 4);
                qh[l] = (uint8_t)((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 |
                                  (Lh[l + 96] >> 4) << 6);
            }
        }
    }
}

void dequantize_q6_K(const struct block_q6_K *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, s = (e % 128) / 32, l = e % 32;
            const uint8_t ql = b[i].ql[64 * h + l + 32 * (s & 1)];
            const int q =
                ((s < 2 ? ql & 0xf : ql >> 4) | ((b[i].qh[32 * h + l] >> (2 * s)) & 3) << 4);
            *y++ = d * b[i].scales[e / 16] * (q - 32);
        }
    }
}
