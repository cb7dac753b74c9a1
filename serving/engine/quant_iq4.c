/* quant_iq4: IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256), the non-linear 4-bit
 * formats: a nibble indexes kvalues_iq4nl. Quantized as llama-quantize does without an importance
 * matrix (ggml's quantize_iq4_nl / quantize_iq4_xs: 7 tries each side of the first scale,
 * weights x^2), in ggml's order of float operations (see quant.c). */
#include "serving/engine/quant.h"

#include "serving/engine/quant_blocks.h"

#include <math.h>
#include <string.h>

const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

#define GROUP_MAX_EPS 1e-15f
#define NTRY          7

/* The level nearest x (ties to the upper one); kvalues_iq4nl is sorted. */
static int nearest_level(float x)
{
    const int8_t *v = kvalues_iq4nl;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* The best scale for one block of 32 (levels L), weights x^2: start from the scale that maps the
 * extreme to the -127 end, then try 2 * NTRY + 1 others; keep the best weighted fit. Returns 0
 * for an all-zero block (L untouched). */
static float fit_block(const float *x, uint8_t *L)
{
    const int8_t *v = kvalues_iq4nl;
    float w[32];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
        w[j] = x[j] * x[j];
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < GROUP_MAX_EPS) return 0;
    float d = -max / v[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        int l = nearest_level(id * x[j]);
        L[j] = (uint8_t)l;
        float q = v[l];
        sumqx += w[j] * q * x[j];
        sumq2 += w[j] * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -NTRY; itry <= NTRY; itry++) {
        id = (itry + v[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            float q = v[nearest_level(id * x[j])];
            sumqx += w[j] * q * x[j];
            sumq2 += w[j] * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Nibbles of n elements (a multiple of 32): per 32, byte j holds element j (low) and j+16. */
static void pack_nibbles(const uint8_t *L, uint8_t *q, int n)
{
    for (int i = 0; i < n / 32; i++)
        for (int j = 0; j < 16; j++)
            q[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

void quantize_iq4_nl(const float *x, struct block_iq4_nl *y, int nb)
{
    for (int i = 0; i < nb; i++, x += 32) {
        uint8_t L[32];
        float d = fit_block(x, L);
        y[i].d = f32_to_fp16(d);
        /* Requantize against the chosen scale (ggml does, even for an all-zero block). */
        float id = d ? 1 / d : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_level(id * x[j]);
        pack_nibbles(L, y[i].qs, 32);
    }
}

void quantize_iq4_xs(const float *x, struct block_iq4_xs *y, int nb)
{
    for (int i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[8];
        float max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < 8; ib++) {
            scales[ib] = fit_block(x + 32 * ib, L + 32 * ib);
            if (fabsf(scales[ib]) > amax_scale) {
                amax_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        /* 6-bit sub-block scales (level - 32 times d), d maps the extreme scale to -32. */
        float d = -max_scale / 32;
        y[i].d = f32_to_fp16(d);
        y[i].scales_h = 0;
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < 8; ib++) {
            int l = quant_nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++)
                L[32 * ib + j] = (uint8_t)nearest_level(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0)
                y[i].scales_l[ib / 2] = (uint8_t)(l & 0xf);
            else
                y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xf) << 4);
            y[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        pack_nibbles(L, y[i].qs, QK_K);
    }
}

void dequantize_iq4_nl(const struct block_iq4_nl *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++, y += 32) {
        const float d = fp16_to_f32(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * kvalues_iq4nl[b[i].qs[j] & 0xf];
            y[j + 16] = d * kvalues_iq4nl[b[i].qs[j] >> 4];
        }
    }
}

int iq4_xs_scale(int j, const struct block_iq4_xs *b)
{
    return ((b->scales_l[j / 2] >> 4 * (j % 2)) & 0xf) | ((b->scales_h >> 2 * j) & 3) << 4;
}

void dequantize_iq4_xs(const struct block_iq4_xs *b, float *y, int nb)
{
    for (int i = 0; i < nb; i++) {
        const float d = fp16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            const float dl = d * (iq4_xs_scale(ib, &b[i]) - 32);
            const uint8_t *qs = b[i].qs + 16 * ib;
            for (int j = 0; j < 16; j++) {
                y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}
