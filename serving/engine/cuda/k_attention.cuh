/* k_attention: paged causal attention for prefill and decode alike. Token t of a step attends
 * over positions 0..pos[t] of its own sequence, found through its block table, which already
 * holds this step's keys (k_rope_store runs first), so a prompt chunk is causal by construction.
 *
 * Grid (n_heads, n_tok, n_split), CUDA_ATTN_THREADS (4 warps). A step with few tokens would give
 * the GPU one block per head (32 blocks on a 132-SM H200, each walking every position in turn),
 * so the positions of a token are split into n_split contiguous ranges (cuda_attention_splits:
 * flash-decoding), each block writing its partial (running max m, sum l, unnormalised output) to
 * `part`; the last of a token's n_split blocks to finish (counted in cnt[token][head], which it
 * sets back to 0 for the next launch) combines them, so the merge costs no launch of its own;
 * with n_split = 1 the block writes the output.
 * Inside a block the range is walked in tiles of CUDA_ATTN_TILE positions with an online softmax
 * (no shared memory in proportion to the context): the tile's cache rows are looked up once
 * (roff), scores take a warp per position (lanes across head_dim, two positions in flight), the
 * values a warp per position too, each lane holding its head_dim / 32 output columns in
 * registers, so every load of both passes is a warp's coalesced row and independent of the last.
 * Grouped-query: head h reads kv head h / (n_heads / n_kv_heads). */
#pragma once

#include "cuda_attn_limits.h"

#define ATT_COLS  (CUDA_ATTN_MAX_HD / 32) /* output columns a lane holds */
#define ATT_WARPS (CUDA_ATTN_THREADS / 32)

/* The ns partials of (token, head) `row` into the output, by the block that finished last: an
 * empty range (a split past the token's position) has l = 0 and counts for nothing. The other
 * blocks' partials are read from L2 (__ldcg), where their fenced stores are. */
__device__ __forceinline__ void attention_merge(const float *part, float *out, size_t row, int hd,
                                                int ns)
{
    __shared__ float wgt[CUDA_ATTN_MAX_SPLIT];
    const float *p = part + row * ns * (size_t)(hd + 2);
    if (threadIdx.x < 32) { /* the first warp: a split a lane (ns <= 32) */
        int s = threadIdx.x;
        float ms = s < ns ? __ldcg(p + s * (hd + 2)) : -INFINITY,
              ls = s < ns ? __ldcg(p + s * (hd + 2) + 1) : 0.f;
        if (ls <= 0.f) ms = -INFINITY;
        float mx = warp_max(ms);
        float e = ls > 0.f ? expf(ms - mx) : 0.f, L = warp_sum(e * ls);
        if (s < ns) wgt[s] = e / L;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < ns; s++) a += wgt[s] * __ldcg(p + s * (hd + 2) + 2 + d);
        out[row * hd + d] = a;
    }
}

extern "C" __global__ void __launch_bounds__(CUDA_ATTN_THREADS)
    k_attention(const float *q, const float *kc, const float *vc, float *out, float *part, int *cnt,
                const int *pos, const int *bt, int max_blocks, int layer, int n_blocks, int bs,
                int n_heads, int n_kv_heads, int hd, float scale)
{
    __shared__ float qs[CUDA_ATTN_MAX_HD];
    __shared__ float sc[CUDA_ATTN_TILE];
    __shared__ size_t roff[CUDA_ATTN_TILE];
    __shared__ float accw[ATT_WARPS][CUDA_ATTN_MAX_HD];
    __shared__ float red[33];
    int h = blockIdx.x, t = blockIdx.y, s = blockIdx.z, ns = gridDim.z;
    int n = pos[t] + 1, chunk = (n + ns - 1) / ns, j0 = s * chunk;
    int j1 = j0 + chunk < n ? j0 + chunk : n;
    int kvh = h / (n_heads / n_kv_heads), kv_dim = n_kv_heads * hd;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int *table = bt + (size_t)t * max_blocks;
    size_t lbase = (size_t)layer * n_blocks * bs * kv_dim + (size_t)kvh * hd;
    const float *kb = kc + lbase, *vb = vc + lbase;

    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        qs[d] = q[(size_t)t * n_heads * hd + (size_t)h * hd + d];
    float acc[ATT_COLS];
#pragma unroll
    for (int i = 0; i < ATT_COLS; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;

    for (int t0 = j0; t0 < j1; t0 += CUDA_ATTN_TILE) {
        int tn = j1 - t0 < CUDA_ATTN_TILE ? j1 - t0 : CUDA_ATTN_TILE;
        __syncthreads(); /* q is in; the last tile's sc and roff are read */
        for (int jj = threadIdx.x; jj < tn; jj += blockDim.x) {
            int j = t0 + jj;
            roff[jj] = ((size_t)table[j / bs] * bs + j % bs) * kv_dim;
        }
        __syncthreads();
        for (int jj = warp; jj < tn; jj += 2 * ATT_WARPS) {
            int j2 = jj + ATT_WARPS;
            const float *k0 = kb + roff[jj], *k1 = kb + roff[j2 < tn ? j2 : jj];
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int i = 0; i < ATT_COLS; i++) {
                int d = lane + 32 * i;
                if (d < hd) s0 += qs[d] * k0[d], s1 += qs[d] * k1[d];
            }
            s0 = warp_sum(s0);
            s1 = warp_sum(s1);
            if (lane == 0) {
                sc[jj] = s0 * scale;
                if (j2 < tn) sc[j2] = s1 * scale;
            }
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int jj = threadIdx.x; jj < tn; jj += blockDim.x) tm = fmaxf(tm, sc[jj]);
        tm = block_max(tm, red);
        float mn = fmaxf(m, tm), corr = expf(m - mn); /* 0 on the first tile */
        float ps = 0.f;
        for (int jj = threadIdx.x; jj < tn; jj += blockDim.x) {
            float e = expf(sc[jj] - mn);
            sc[jj] = e;
            ps += e;
        }
        ps = block_sum(ps, red); /* its barriers also publish sc[] */
        l = l * corr + ps;
        m = mn;
#pragma unroll
        for (int i = 0; i < ATT_COLS; i++) acc[i] *= corr;
#pragma unroll 4
        for (int jj = warp; jj < tn; jj += ATT_WARPS) {
            const float *vp = vb + roff[jj];
            float e = sc[jj];
#pragma unroll
            for (int i = 0; i < ATT_COLS; i++) {
                int d = lane + 32 * i;
                if (d < hd) acc[i] += e * vp[d];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_COLS; i++) {
        int d = lane + 32 * i;
        if (d < hd) accw[warp][d] = acc[i];
    }
    __syncthreads();
    size_t row = (size_t)t * n_heads + h;
    float *pp = part + (row * ns + s) * (size_t)(hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) a += accw[w][d];
        if (ns == 1)
            out[row * hd + d] = a * (1.0f / l);
        else
            pp[2 + d] = a;
    }
    if (ns == 1) return;
    if (threadIdx.x == 0) pp[0] = m, pp[1] = l;
    __threadfence(); /* this block's partial visible to every block before it is counted */
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) {
        last = atomicAdd(&cnt[row], 1) == ns - 1;
        if (last) cnt[row] = 0;
    }
    __syncthreads();
    if (last) attention_merge(part, out, row, hd, ns);
}
