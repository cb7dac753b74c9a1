/* fwd_kernels: the plain C kernels (the reference the SIMD ones are tested against) and the
 * choice of table. The SIMD kernels are in fwd_simd.inc, compiled by kernels_avx2.c and
 * kernels_avx512.c (x86-64), kernels_neon*.c (aarch64). */
#include "serving/engine/fwd_kernels.h"

#include "serving/engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
extern const struct fwd_kernels fwd_kernels_avx2, fwd_kernels_avx512;
#elif defined(__aarch64__)
extern const struct fwd_kernels fwd_kernels_neon, fwd_kernels_dotprod, fwd_kernels_i8mm;
#endif

/* Element i of a run of cache elements. */
static inline float kv_elt(const struct kv_cache *kv, const void *run, size_t i)
{
    return kv->type == KV_F32 ? ((const float *)run)[i] : fp16_to_f32(((const uint16_t *)run)[i]);
}

/* One head: scores over every position, softmax, then the weighted sum of the values. The cache
 * is walked block by block (a block holds block_size consecutive positions; its keys are
 * transposed, kv_cache.h). */
static void attend_head_scalar(const struct attn_args *a, int h)
{
    const struct kv_cache *kv = a->kv;
    int hd = a->hd, n = a->pos + 1, bs = kv->block_size;
    size_t off = (size_t)(h / a->group) * hd;
    const float *q = a->q + (size_t)h * hd;
    float *att = a->att, *out = a->out + (size_t)h * hd;
    float max = -INFINITY;
    for (int p0 = 0; p0 < n; p0 += bs) {
        const void *k = kv_key_block(kv, a->layer, a->blocks[p0 / bs]);
        for (int p = p0; p < n && p < p0 + bs; p++) {
            float s = 0.0f;
            for (int i = 0; i < hd; i++) s += q[i] * kv_elt(kv, k, (off + i) * bs + (p - p0));
            att[p] = s * a->scale;
            if (att[p] > max) max = att[p];
        }
    }
    float sum = 0.0f;
    for (int p = 0; p < n; p++) {
        att[p] = expf(att[p] - max);
        sum += att[p];
    }
    float inv = 1.0f / sum;
    memset(out, 0, (size_t)hd * sizeof *out);
    for (int p0 = 0; p0 < n; p0 += bs) {
        /* this kv head's run of the block: one row of hd per position */
        const char *v = (const char *)kv_value_block(kv, a->layer, a->blocks[p0 / bs]) +
                        (size_t)(h / a->group) * bs * hd * kv->elt;
        for (int p = p0; p < n && p < p0 + bs; p++, v += (size_t)hd * kv->elt) {
            float w = att[p] * inv;
            for (int i = 0; i < hd; i++) out[i] += w * kv_elt(kv, v, i);
        }
    }
}

void fwd_attend_scalar(const struct attn_args *a, int h0, int h1)
{
    for (int h = h0; h < h1; h++) attend_head_scalar(a, h);
}

void fwd_kv_store_scalar(const struct kv_cache *kv, int layer, int block, int slot, const float *k,
                         const float *v)
{
    int n = kv->kv_dim, bs = kv->block_size, hd = kv->head_dim, f32 = kv->type == KV_F32;
    char *kb = kv_key_block(kv, layer, block), *vb = kv_value_block(kv, layer, block);
    for (int i = 0; i < n; i++) {
        size_t ki = (size_t)i * bs + slot; /* its column in the block's keys */
        if (f32)
            ((float *)kb)[ki] = k[i];
        else
            ((uint16_t *)kb)[ki] = f32_to_fp16(k[i]);
    }
    for (int g = 0; g < n / hd; g++) { /* its row in each kv head's run of values */
        char *vr = vb + ((size_t)g * bs + slot) * hd * kv->elt;
        const float *src = v + (size_t)g * hd;
        if (f32)
            memcpy(vr, src, (size_t)hd * sizeof(float));
        else
            for (int d = 0; d < hd; d++) ((uint16_t *)vr)[d] = f32_to_fp16(src[d]);
    }
}

static void swiglu_scalar(float *g, const float *u, int n)
{
    for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static const struct fwd_kernels fwd_kernels_scalar = {
    .name = "scalar",
    .attend = fwd_attend_scalar,
    .kv_store = fwd_kv_store_scalar,
    .swiglu = swiglu_scalar,
};

const struct fwd_kernels *fwd_kernels_for(const char *isa)
{
#if defined(__x86_64__)
    if (isa && !strcmp(isa, "avx512")) return &fwd_kernels_avx512;
    /* AVX-VNNI adds integer dots only: its float kernels are AVX2's */
    if (isa && (!strcmp(isa, "avx2") || !strcmp(isa, "avxvnni"))) return &fwd_kernels_avx2;
#elif defined(__aarch64__)
    if (isa && !strcmp(isa, "i8mm")) return &fwd_kernels_i8mm;
    if (isa && !strcmp(isa, "dotprod")) return &fwd_kernels_dotprod;
    if (isa && !strcmp(isa, "neon")) return &fwd_kernels_neon;
#else
    (void)isa;
#endif
    return &fwd_kernels_scalar;
}
