/* k_gemvq: GEMV (decode, up to 8 tokens) for every block type (k_quant.cuh), with integer dot
 * products against activations quantized as the CPU engine quantizes them, so that decoding on
 * the GPU adds the same exact integers as the CPU and differs only in the order floats are summed.
 *
 * One launch: k_gemvq_<fam>_<NT>(gemv_args, x, nt), fam "k" (Q2_K..Q6_K, IQ4_XS: Q8_K
 * activations) or "32" (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: Q8_0/Q8_1); the matrices of one
 * launch may mix the types of a family (Q4_K_M's q, k and v: Q4_K, Q4_K and Q6_K). Q8_0 and Q4_0
 * are in the "32" family (Q8_0 activations, as on the CPU).
 *
 *   1. k_gemvq_quant_<fam> (or k_rmsnorm_quant_<fam>, the RMSNorm before it fused in) writes the
 *      nt activation rows quantized, in the layout below, to a device buffer; each 256-thread
 *      block asks L2 for its first row's quants, copies that buffer into shared memory (the super
 *      family's int8 values with each 64-byte group's 16-byte pieces permuted: kq_swz), and each
 *      warp takes rpw rows, the next row's first quants asked of L2 before this one is worked.
 *   2. One warp per row: lane l takes the row's 16-byte chunks l, l+32, ...: a warp's load is 512
 *      contiguous bytes of the quants plane (plus each block's scales, the same address for the
 *      block's 4 or 8 lanes), 4 chunks in flight per lane before any is used (2 for Q3_K, Q5_K,
 *      Q6_K, whose chunks take more registers); the non-coherent loads skip L1. Launches whose
 *      matrices are all Q4_K (k_gemvq_q4k_*) take 32-byte units instead (gemvq_row_q4k).
 *   3. Per chunk: nibbles (and high bits) unpacked with masks, dp4a against the activations in
 *      shared memory, the exact integer sums scaled as the CPU scales a block's; nt tokens share
 *      each chunk's unpacking. A warp reduction, then lane 0 writes (store, add, or SwiGLU).
 *
 * Shared memory for nt tokens of `cols` (cuda_plan.h cuda_gemvq_smem): the quantized values
 * [nt][cols] int8, then Q8_K: d [nt][cols/256] float, bsums [nt][cols/16] int16; Q8_0/1:
 * {d, s, sum, 0} [nt][cols/32] float4. */
#pragma once

#define GEMVQ_UNROLL 4
#define GEMVQ_WARPS  (GEMV_THREADS / 32)

enum { GEMVQ_SUPER = 0, GEMVQ_32 = 1 };

/* Where lane `lane` reads its 8 values of the warp's quantization step `step` (FAM_SUPER: one
 * 256-block a step; FAM_32: eight 32-blocks, 4 lanes each), or NULL past the end. The shared
 * memory copy has x's layout, so the same offset from x places the quantized values. */
template <int FAM>
__device__ __forceinline__ const float *gemvq_src(const float *x, int nt, int cols, int step,
                                                  int lane)
{
    int per = FAM == GEMVQ_SUPER ? 256 : 32, nb = cols / per;
    int it = FAM == GEMVQ_SUPER ? step : 8 * step + (lane >> 2);
    if (it >= nt * nb) return NULL;
    int t = it / nb, b = it - t * nb;
    return x + (size_t)t * cols + per * b + 8 * (FAM == GEMVQ_SUPER ? lane : lane & 3);
}

__device__ __forceinline__ uint2 gemvq_pack8(const int *q)
{
    uint2 pk;
    pk.x = (uint32_t)(q[0] & 255) | (uint32_t)(q[1] & 255) << 8 | (uint32_t)(q[2] & 255) << 16 |
           (uint32_t)(q[3] & 255) << 24;
    pk.y = (uint32_t)(q[4] & 255) | (uint32_t)(q[5] & 255) << 8 | (uint32_t)(q[6] & 255) << 16 |
           (uint32_t)(q[7] & 255) << 24;
    return pk;
}

/* One warp's quantization step: lane `lane` holds 8 values v of x at offset off (SUPER: a warp is
 * one 256-block of Q8_K; FAM_32: 4 lanes a 32-block of Q8_0/1, ok false past the end), written
 * into xq in the layout above: the int8 values at off, then the block's scale and sums. */
template <int FAM>
__device__ __forceinline__ void gemvq_quant8(const float *v, bool ok, size_t off, uint8_t *xq,
                                             int nt, int cols)
{
    const int lane = threadIdx.x & 31;
    int8_t *aq = (int8_t *)xq;
    float am = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) am = fmaxf(am, fabsf(v[i]));
    int q[8], s = 0;
    if (FAM == GEMVQ_SUPER) {
        float *ad = (float *)(xq + (size_t)nt * cols);
        int16_t *bs = (int16_t *)(ad + (size_t)nt * (cols / 256));
        am = warp_max(am);
        float d = 0.f;
        if (am > 0.f) {
            float is = kq_q8k_iscale(am);
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = kq_q8k_q(is, v[i]), s += q[i];
            d = kq_div(1.f, is);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] = 0;
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1); /* lanes 2g, 2g+1 hold group g of 16 */
        *(uint2 *)(aq + off) = gemvq_pack8(q);
        if (!(lane & 1)) bs[off / 16] = (int16_t)s;
        if (lane == 0) ad[off / 256] = d;
    } else {
        float4 *meta = (float4 *)(xq + (size_t)nt * cols);
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
        float id = kq_q8_id(am);
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = kq_q8_q(id, v[i]), s += q[i];
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (ok) {
            *(uint2 *)(aq + off) = gemvq_pack8(q);
            if (!(lane & 3))
                meta[off / 32] = make_float4(kq_q8_d(am), kq_q8_s(am, s), __int_as_float(s), 0.f);
        }
    }
}

/* Quantize rows t < nt of x (nt x cols f32) into xq; every thread of the block. A warp takes
 * steps wib, wib + wstride, ...; the next step's values are loaded before this one is worked, so
 * the L2 latency is paid about once per warp, not once per step. */
template <int FAM>
__device__ __forceinline__ void gemvq_quantize(const float *x, int nt, int cols, uint8_t *xq,
                                               int wib, int wstride)
{
    const int lane = threadIdx.x & 31;
    const int steps = FAM == GEMVQ_SUPER ? nt * (cols / 256) : (nt * (cols / 32) + 7) / 8;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    const float *src = gemvq_src<FAM>(x, nt, cols, wib, lane);
    float4 n0 = src ? __ldg((const float4 *)src) : zero;
    float4 n1 = src ? __ldg((const float4 *)src + 1) : zero;
    for (int step = wib; step < steps; step += wstride) { /* warp-uniform */
        const float *cur = src;
        float v[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
        src = gemvq_src<FAM>(x, nt, cols, step + wstride, lane);
        n0 = src ? __ldg((const float4 *)src) : zero;
        n1 = src ? __ldg((const float4 *)src + 1) : zero;
        gemvq_quant8<FAM>(v, cur != NULL, cur ? (size_t)(cur - x) : 0, xq, nt, cols);
    }
}

/* This lane's share of row r's dot products with the nt quantized tokens, for weight type WT. */
template <int WT, int NT>
__device__ __forceinline__ void gemvq_row_t(const dmat &w, int r, const uint8_t *smem, int nt,
                                            float *acc)
{
    const int CH = WT == KQ_Q2_K || WT == KQ_Q3_K ? 4 : WT == KQ_Q8_0 ? 2 : kq_is_32(WT) ? 1 : 8;
    const int BE = kq_is_32(WT) ? 32 : 256;
    const int lane = threadIdx.x & 31, cols = w.cols, nb = cols / BE, nch = nb * CH;
    const struct kq_planes p = {(const uint8_t *)w.qs, w.e, w.s, (const uint8_t *)w.d};
    const long long b0 = (long long)r * nb;
    const int8_t *aq = (const int8_t *)smem;
    /* chunks in flight per lane: fewer for the formats with a high-bits plane (more registers) */
    const int U = WT == KQ_Q3_K || WT == KQ_Q5_K || WT == KQ_Q6_K ? 2 : GEMVQ_UNROLL;
    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
        struct kq_chunk ch[GEMVQ_UNROLL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + 32 * u;
            if (c < nch) kq_load(WT, &p, b0 + c / CH, c % CH, &ch[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + 32 * u;
            if (c >= nch) break;
            int b = c / CH, k = c % CH;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const int8_t *a = aq + (size_t)t * cols + BE * b;
                if (BE == 256) {
                    const float *ad = (const float *)(smem + (size_t)nt * cols);
                    const int16_t *bs = (const int16_t *)(ad + (size_t)nt * nb);
                    acc[t] += kq_dot_super(WT, &ch[u], k, a, ad[(size_t)t * nb + b],
                                           bs + (size_t)t * (cols / 16) + 16 * b);
                } else {
                    const float4 m =
                        ((const float4 *)(smem + (size_t)nt * cols))[(size_t)t * nb + b];
                    acc[t] += kq_dot_32(WT, &ch[u], k, a, m.x, m.y, __float_as_int(m.z));
                }
            }
        }
    }
}

/* Q4_K (most of a Q4_K_M file's bytes) by units: a lane takes 32 bytes of quants, sub-blocks 2g
 * and 2g+1 of a block (kq_dot_q4k_unit: one scale decode for 64 weights, about half the
 * instructions a byte of the chunk loop, which is what bounds the GEMV at batch 1), lane l the
 * units l, l + 32, ...: a warp's two loads read 1 KiB of contiguous quants. GEMVQ_UNITS units in
 * flight per lane (one token: 4, 128 bytes of quants; more tokens: 1, for their registers). */
template <int NT>
__device__ __forceinline__ void gemvq_row_q4k(const dmat &w, int r, const uint8_t *smem, int nt,
                                              float *acc)
{
    const int UN = NT == 1 ? 4 : 1;
    const int lane = threadIdx.x & 31, cols = w.cols, nb = cols / 256, nu = 4 * nb;
    const uint8_t *qs = (const uint8_t *)w.qs + (size_t)r * nb * 128;
    const uint8_t *hd = (const uint8_t *)w.d + (size_t)r * nb * 16;
    const float *ad = (const float *)(smem + (size_t)nt * cols);
    const int16_t *bs = (const int16_t *)(ad + (size_t)nt * nb);
    for (int u0 = lane; u0 < nu; u0 += 32 * UN) {
        uint32_t q[UN][8], h[UN][4];
#pragma unroll
        for (int i = 0; i < UN; i++) {
            int u = u0 + 32 * i;
            if (u < nu) {
                kq_ld16(qs + 32 * u, q[i]);
                kq_ld16(qs + 32 * u + 16, q[i] + 4);
                kq_ld16(hd + 16 * (u >> 2), h[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < UN; i++) {
            int u = u0 + 32 * i;
            if (u >= nu) break;
            int b = u >> 2, g = u & 3;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                acc[t] += kq_dot_q4k_unit(
                    q[i], h[i], g, (const int8_t *)smem + (size_t)t * cols + 256 * b,
                    ad[(size_t)t * nb + b], bs + (size_t)t * (cols / 16) + 16 * b);
            }
        }
    }
}

/* Row r's dot products with the nt tokens, warp-summed. Q4K: every matrix of the launch is Q4_K
 * (k_gemvq_q4k_*: the unit loop alone, no other type's registers). */
template <int FAM, int NT, int Q4K>
__device__ __forceinline__ void gemvq_row(const dmat &w, int r, const uint8_t *smem, int nt,
                                          float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (Q4K) {
        gemvq_row_q4k<NT>(w, r, smem, nt, acc);
    } else if (FAM == GEMVQ_SUPER) {
        switch (w.type) { /* warp-uniform */
        case KQ_Q2_K:
            gemvq_row_t<KQ_Q2_K, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q3_K:
            gemvq_row_t<KQ_Q3_K, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q4_K:
            gemvq_row_t<KQ_Q4_K, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q5_K:
            gemvq_row_t<KQ_Q5_K, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q6_K:
            gemvq_row_t<KQ_Q6_K, NT>(w, r, smem, nt, acc);
            break;
        case KQ_IQ4_XS:
            gemvq_row_t<KQ_IQ4_XS, NT>(w, r, smem, nt, acc);
            break;
        }
    } else {
        switch (w.type) {
        case KQ_Q8_0:
            gemvq_row_t<KQ_Q8_0, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q4_0:
            gemvq_row_t<KQ_Q4_0, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q4_1:
            gemvq_row_t<KQ_Q4_1, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q5_0:
            gemvq_row_t<KQ_Q5_0, NT>(w, r, smem, nt, acc);
            break;
        case KQ_Q5_1:
            gemvq_row_t<KQ_Q5_1, NT>(w, r, smem, nt, acc);
            break;
        case KQ_IQ4_NL:
            gemvq_row_t<KQ_IQ4_NL, NT>(w, r, smem, nt, acc);
            break;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
}

/* The first quants of row r into L2 ahead of the warp's turn at it: up to 4 KiB, a line a lane.
 * (The whole row and its scale planes were tried: 7-10% slower on an H200, every block type.) */
__device__ __forceinline__ void gemvq_prefetch(const dmat &w, int r)
{
    int t = w.type, lane = threadIdx.x & 31;
    long long row_bytes = (long long)(w.cols / kq_block_elems(t)) * kq_qs_bytes(t);
    if (128LL * lane < row_bytes) {
        const uint8_t *p = (const uint8_t *)w.qs + r * row_bytes + 128 * lane;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
}

/* Bytes of nt quantized tokens of `cols` (cuda_plan.h cuda_gemvq_smem, before rounding). */
template <int FAM> __device__ __forceinline__ int gemvq_bytes(int cols, int nt)
{
    return nt *
           (FAM == GEMVQ_SUPER ? cols + cols / 256 * 4 + cols / 16 * 2 : cols + cols / 32 * 16);
}

/* Row g of the launch (over the matrices: q, k, v one after another): its matrix i and row r. */
__device__ __forceinline__ int gemvq_locate(const gemv_args &a, int g, int *r)
{
    int i = g < a.rows_end[0] ? 0 : g < a.rows_end[1] ? 1 : 2;
    *r = g - (i == 0 ? 0 : a.rows_end[i - 1]);
    return i;
}

/* One row of the launch, y written by lane 0. */
template <int FAM, int NT, int Q4K>
__device__ __forceinline__ void gemvq_one(const gemv_args &a, int g, const uint8_t *xs, int nt)
{
    int lane = threadIdx.x & 31, r, i = gemvq_locate(a, g, &r);
    const dmat &w = i == 0 ? a.w[0] : i == 1 ? a.w[1] : a.w[2];
    float *y = i == 0 ? a.y[0] : i == 1 ? a.y[1] : a.y[2];
    float acc[NT];
    gemvq_row<FAM, NT, Q4K>(w, r, xs, nt, acc);
    if (a.mode == GEMV_SWIGLU) {
        float up[NT];
        gemvq_row<FAM, NT, Q4K>(a.w[1], r, xs, nt, up);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = acc[t] / (1.0f + expf(-acc[t])) * up[t];
    }
    if (lane == 0)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            float *o = y + (size_t)t * w.rows + r;
            if (a.mode == GEMV_ADD)
                *o += acc[t];
            else
                *o = acc[t];
        }
}

__device__ __forceinline__ void gemvq_prefetch_g(const gemv_args &a, int g)
{
    int r, i = gemvq_locate(a, g, &r);
    gemvq_prefetch(i == 0 ? a.w[0] : i == 1 ? a.w[1] : a.w[2], r);
    if (a.mode == GEMV_SWIGLU) gemvq_prefetch(a.w[1], r);
}

/* xq: the nt tokens already quantized (k_gemvq_quant_*), copied into shared memory once per
 * block; then each warp takes rpw rows (block b's rows b * 8 * rpw + 8 k + warp), the next
 * row's first quants asked of L2 before this one is worked. */
template <int FAM, int NT, int Q4K>
__device__ __forceinline__ void gemvq_entry(const gemv_args &a, const uint8_t *xq, int nt, int rpw)
{
    int total = a.rows_end[a.n_mats - 1], warp = threadIdx.x >> 5;
    int g = blockIdx.x * GEMVQ_WARPS * rpw + warp;
    if (g < total) gemvq_prefetch_g(a, g);
    /* the int8 values of the super-block family go in permuted (kq_swz, read by kq_ldas16: a
     * permutation within each 64-byte group of the offsets) */
    unsigned base = (unsigned)__cvta_generic_to_shared(gemvq_smem);
    int n16 = (gemvq_bytes<FAM>(a.w[0].cols, nt) + 15) / 16;
    int nq = FAM == GEMVQ_SUPER ? nt * a.w[0].cols / 16 : 0;
    for (int i = threadIdx.x; i < n16; i += blockDim.x) {
        uint4 v = __ldg((const uint4 *)xq + i);
        unsigned s = i < nq ? kq_swz(16u * (unsigned)i) : base + 16u * (unsigned)i;
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(s), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w)
                     : "memory");
    }
    __syncthreads();
    for (int k = 0; k < rpw && g < total; k++, g += GEMVQ_WARPS) { /* warp-uniform */
        if (k + 1 < rpw && g + GEMVQ_WARPS < total) gemvq_prefetch_g(a, g + GEMVQ_WARPS);
        gemvq_one<FAM, NT, Q4K>(a, g, gemvq_smem, nt);
    }
}

/* k_gemvq_quant_<fam>(x, nt, cols, xq): x (nt x cols f32) quantized into xq in the shared-memory
 * layout above, each warp of the grid a step of gemvq_quantize at a time. */
#define GEMVQ_QUANT(name, FAM)                                                                     \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                     \
        k_gemvq_quant_##name(const float *x, int nt, int cols, uint8_t *xq)                        \
    {                                                                                              \
        gemvq_quantize<FAM>(x, nt, cols, xq, (blockIdx.x * blockDim.x + threadIdx.x) >> 5,         \
                            (gridDim.x * blockDim.x) >> 5);                                        \
    }
GEMVQ_QUANT(k, GEMVQ_SUPER)
GEMVQ_QUANT(32, GEMVQ_32)

/* k_rmsnorm_quant_<fam>(x, w, out, dim, eps, xq, nt): k_rmsnorm then k_gemvq_quant_<fam> in one
 * launch, for a step whose next GEMV takes all nt tokens in one pass (decode): block t
 * normalises token t as k_rmsnorm does (same sums in the same order, so the same floats; out
 * gets them too), keeps the row in shared memory (dim floats) and quantizes it into xq's layout
 * for nt tokens, a warp a step. Grid: nt blocks of 1024 threads. */
template <int FAM>
__device__ __forceinline__ void rmsnorm_quant(const float *x, const float *w, float *out, int dim,
                                              float eps, uint8_t *xq, int nt)
{
    extern __shared__ __align__(16) float rq_row[];
    __shared__ float red[33];
    int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float4 *x4 = (const float4 *)(x + (size_t)t * dim), *w4 = (const float4 *)w;
    float ss = 0.f;
    for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
        float4 v = x4[c];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf(ss / dim + eps);
    for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
        float4 v = x4[c], g = w4[c];
        float4 o = make_float4(g.x * (scale * v.x), g.y * (scale * v.y), g.z * (scale * v.z),
                               g.w * (scale * v.w));
        ((float4 *)rq_row)[c] = o;
        ((float4 *)(out + (size_t)t * dim))[c] = o;
    }
    __syncthreads();
    size_t row = (size_t)t * dim;
    if (FAM == GEMVQ_SUPER) {
        for (int b = warp; b < dim / 256; b += nw) { /* warp-uniform */
            const float *src = rq_row + 256 * b + 8 * lane;
            float v[8] = {src[0], src[1], src[2], src[3], src[4], src[5], src[6], src[7]};
            gemvq_quant8<GEMVQ_SUPER>(v, true, row + 256 * b + 8 * lane, xq, nt, dim);
        }
    } else {
        int nblk = dim / 32;
        for (int s = warp; 8 * s < nblk; s += nw) { /* warp-uniform */
            int blk = 8 * s + (lane >> 2);
            bool ok = blk < nblk;
            float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            if (ok)
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = rq_row[32 * blk + 8 * (lane & 3) + i];
            gemvq_quant8<GEMVQ_32>(v, ok, row + 32 * blk + 8 * (lane & 3), xq, nt, dim);
        }
    }
}
#define RMSNORM_QUANT(name, FAM)                                                                   \
    extern "C" __global__ void __launch_bounds__(1024) k_rmsnorm_quant_##name(                     \
        const float *x, const float *w, float *out, int dim, float eps, uint8_t *xq, int nt)       \
    {                                                                                              \
        rmsnorm_quant<FAM>(x, w, out, dim, eps, xq, nt);                                           \
    }
RMSNORM_QUANT(k, GEMVQ_SUPER)
RMSNORM_QUANT(32, GEMVQ_32)

/* Entry points k_gemvq_<fam>_<NT>(args, xq, nt, rpw), fam k, 32, or q4k (every matrix of the
 * launch Q4_K, the super family's activations). Grid: ceil(total rows / (8 rpw)) blocks of 256
 * threads; dynamic shared memory cuda_gemvq_smem(type, cols, nt). Registers: at most 80 for one
 * token (3 blocks, 24 warps an SM: the decode case, where bandwidth is all), 128 for more. */
#define GEMVQ_ENTRY(name, FAM, Q4K, NT, MINB)                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS, MINB)                               \
        k_gemvq_##name##_##NT(gemv_args a, const uint8_t *xq, int nt, int rpw)                     \
    {                                                                                              \
        gemvq_entry<FAM, NT, Q4K>(a, xq, nt, rpw);                                                 \
    }
GEMVQ_ENTRY(k, GEMVQ_SUPER, 0, 1, 3)
GEMVQ_ENTRY(k, GEMVQ_SUPER, 0, 2, 2)
GEMVQ_ENTRY(k, GEMVQ_SUPER, 0, 4, 2)
GEMVQ_ENTRY(k, GEMVQ_SUPER, 0, 8, 2)
GEMVQ_ENTRY(q4k, GEMVQ_SUPER, 1, 1, 3)
GEMVQ_ENTRY(q4k, GEMVQ_SUPER, 1, 2, 2)
GEMVQ_ENTRY(q4k, GEMVQ_SUPER, 1, 4, 2)
GEMVQ_ENTRY(q4k, GEMVQ_SUPER, 1, 8, 2)
GEMVQ_ENTRY(32, GEMVQ_32, 0, 1, 3)
GEMVQ_ENTRY(32, GEMVQ_32, 0, 2, 2)
GEMVQ_ENTRY(32, GEMVQ_32, 0, 4, 2)
GEMVQ_ENTRY(32, GEMVQ_32, 0, 8, 2)
