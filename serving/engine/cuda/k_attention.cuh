/* k_attention: paged causal attention for prefill and decode alike. Token t of a step attends
 * over positions 0..pos[t] of its own sequence, found through its block table, which already
 * holds this step's keys (k_rope_store runs first), so a prompt chunk is causal by construction.
 * Grid: (n_heads, n_tok) blocks of 128 threads; dynamic shared memory holds the scores
 * (ctx floats) and q (hd floats). Grouped-query: head h reads kv head h / (n_heads/n_kv_heads).
 * Scores: one warp per position, lanes across head_dim; values: threads across head_dim, so
 * both read a position's 4*hd bytes coalesced. */
#pragma once

extern "C" __global__ void k_attention(const float *q, const float *kc, const float *vc, float *out,
                                       const int *pos, const int *bt, int max_blocks, int layer,
                                       int n_blocks, int bs, int n_heads, int n_kv_heads, int hd,
                                       float scale)
{
    extern __shared__ float sm[];
    __shared__ float red[33];
    int h = blockIdx.x, t = blockIdx.y, p = pos[t];
    int kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * hd;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *qs = sm, *sc = sm + hd;
    const int *table = bt + (size_t)t * max_blocks;
    size_t lbase = (size_t)layer * n_blocks * bs * kv_dim + (size_t)kvh * hd;

    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = q[(size_t)t * n_heads * hd + (size_t)h * hd + d];
    __syncthreads();

    for (int j = warp; j <= p; j += nw) {
        const float *kp = kc + lbase + ((size_t)table[j / bs] * bs + j % bs) * kv_dim;
        float s = 0.f;
        for (int d = lane; d < hd; d += 32) s += qs[d] * kp[d];
        s = warp_sum(s);
        if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_max(m, red);
    float sum = 0.f;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* its barriers also publish sc[] */
    float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j <= p; j++) {
            const float *vp = vc + lbase + ((size_t)table[j / bs] * bs + j % bs) * kv_dim;
            acc += sc[j] * vp[d];
        }
        out[(size_t)t * n_heads * hd + (size_t)h * hd + d] = acc * inv;
    }
}
