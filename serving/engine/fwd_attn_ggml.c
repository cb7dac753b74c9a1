/* fwd_attn_ggml: attention computed as llama.cpp's default CPU flash attention computes it
 * (ggml-cpu's flash_attn_ext, build 10e97801, on an x86 CPU with FMA and F16C), written from its
 * definition (fwd_kernels.h says what differs from the exact kernels). Per query head:
 *
 *   f16 cache: the query is rounded to f16; each score is the f16 dot product (below) times the
 *     scale; the output accumulates in f16: on a new running maximum M the accumulator is scaled
 *     by expf(Mold - M) and rounded to f16, then acc = f16(fma(v, expf(s - M), acc)) per
 *     element; the weight sum S = fma(S, expf(Mold - M), expf(s - M)); out = f32(acc) * (1 / S).
 *   f32 cache: the same online softmax with an f32 query and an f32 accumulator.
 *
 * The dot products sum as ggml's 8-wide vector code does: 4 accumulators of 8 lanes, element
 * i of each 32-element step fused-multiply-added into lane (i % 32) of accumulator (i % 32) / 8;
 * then accumulators 0+2, 1+3, and those two; lanes l and l + 4; then (0+1) + (2+3). Elements past
 * the last whole 32 add one by one (in double for f16, fused in float for f32). Plain C, one
 * position at a time: slow, and meant to be (it is a reference mode, not a fast path). */
#include "serving/engine/fwd_kernels.h"

#include "serving/engine/quant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_HD 4096 /* model.c's limit on head_dim */

/* ggml's vector dot product of n elements (x: the key, y: the query), as floats. */
static float dot_ggml(const float *x, const float *y, int n, int f16)
{
    float acc[4][8] = {{0}};
    int np = n & ~31;
    for (int i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++)
                acc[j][l] = fmaf(x[i + j * 8 + l], y[i + j * 8 + l], acc[j][l]);
    for (int l = 0; l < 8; l++) {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    float t[4];
    for (int l = 0; l < 4; l++) t[l] = acc[0][l] + acc[0][l + 4];
    float sum = (t[0] + t[1]) + (t[2] + t[3]);
    if (f16) {
        double d = sum;
        for (int i = np; i < n; i++) d += (double)(x[i] * y[i]);
        return (float)d;
    }
    for (int i = np; i < n; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
}

static void attend_head_ggml(const struct attn_args *a, int h)
{
    const struct kv_cache *kv = a->kv;
    int hd = a->hd, n = a->pos + 1, bs = kv->block_size, f16 = kv->type != KV_F32;
    size_t off = (size_t)(h / a->group) * hd;
    const float *q = a->q + (size_t)h * hd;
    float *out = a->out + (size_t)h * hd;
    float qv[MAX_HD], kr[MAX_HD], vr[MAX_HD];
    uint16_t acc16[MAX_HD];
    for (int i = 0; i < hd; i++) qv[i] = f16 ? fp16_to_f32(f32_to_fp16(q[i])) : q[i];
    memset(acc16, 0, (size_t)hd * sizeof *acc16);
    memset(out, 0, (size_t)hd * sizeof *out); /* the f32 accumulator */
    float M = -INFINITY, S = 0.0f;
    for (int p0 = 0; p0 < n; p0 += bs) {
        const void *kb = kv_key_block(kv, a->layer, a->blocks[p0 / bs]);
        const char *vb = (const char *)kv_value_block(kv, a->layer, a->blocks[p0 / bs]) +
                         (size_t)(h / a->group) * bs * hd * kv->elt;
        for (int p = p0; p < n && p < p0 + bs; p++) {
            const void *vrow = vb + (size_t)(p - p0) * hd * kv->elt;
            for (int i = 0; i < hd; i++) { /* this position's key and value, as floats */
                size_t ki = (off + i) * bs + (p - p0);
                kr[i] = f16 ? fp16_to_f32(((const uint16_t *)kb)[ki]) : ((const float *)kb)[ki];
                vr[i] = f16 ? fp16_to_f32(((const uint16_t *)vrow)[i]) : ((const float *)vrow)[i];
            }
            float s = dot_ggml(kr, qv, hd, f16) * a->scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > M) { /* a new maximum: rescale what is accumulated */
                float old = M;
                M = s;
                ms = expf(old - M);
                for (int i = 0; i < hd; i++) {
                    if (f16)
                        acc16[i] = f32_to_fp16(fp16_to_f32(acc16[i]) * ms);
                    else
                        out[i] *= ms;
                }
            } else {
                vs = expf(s - M);
            }
            for (int i = 0; i < hd; i++) {
                if (f16)
                    acc16[i] = f32_to_fp16(fmaf(vr[i], vs, fp16_to_f32(acc16[i])));
                else
                    out[i] = fmaf(vr[i], vs, out[i]);
            }
            S = fmaf(S, ms, vs);
        }
    }
    float inv = S == 0.0f ? 0.0f : 1.0f / S;
    for (int i = 0; i < hd; i++) out[i] = (f16 ? fp16_to_f32(acc16[i]) : out[i]) * inv;
}

int attn_mode_parse(const char *s)
{
    return !strcmp(s, "exact") ? ATTN_EXACT : !strcmp(s, "ggml-fa") ? ATTN_GGML : ATTN_DEFAULT;
}

const char *attn_mode_name(int mode)
{
    return mode == ATTN_GGML ? "ggml-fa" : "exact";
}

void fwd_attend_ggml(const struct attn_args *a, int h0, int h1)
{
    for (int h = h0; h < h1; h++) attend_head_ggml(a, h);
}
