/* k_gemm: y[t][r] = sum_c W[r][c] x[t][c] for many tokens (prefill, large decode batches) on the
 * tensor cores. A 128-thread block computes a 64-row x 64-token tile: per 32-column step it
 * dequantizes the W tile to f16 (bf16 for BF16 weights, whose range f16 lacks) into shared
 * memory, converts the x tile likewise, and the 4 warps run 16x16x16 WMMA (mma.sync) with f32
 * accumulators, each warp a 32x32 quarter. The k_quant.cuh types dequantize 16 elements a
 * thread (kq_deq16: the CPU's values exactly) before the rounding to f16; the 64-row tile of a
 * 32-column step spans whole 16-element groups, so no scale is decoded twice by one thread.
 * Weights are read once per 64 tokens, which moves the
 * bound from HBM to the tensor cores. F32 weights do not come here (the host uses GEMV with 8
 * tokens per pass: F32 models are the tiny ones and need the exact f32 products). */
#pragma once
#include <mma.h>

#define GEMM_BM      64
#define GEMM_BN      64
#define GEMM_BK      32
#define GEMM_LD      (GEMM_BK + 8) /* pad: fewer bank conflicts, ldm stays a multiple of 8 */
#define GEMM_THREADS 128

template <typename T> __device__ __forceinline__ T to_t(float f);
template <> __device__ __forceinline__ __half to_t<__half>(float f)
{
    return __float2half_rn(f);
}
template <> __device__ __forceinline__ __nv_bfloat16 to_t<__nv_bfloat16>(float f)
{
    return __float2bfloat16_rn(f);
}

/* Row m of the W tile, 16 columns from k (h = 0 or 1 picks the half of the 32-column step). */
template <int WT, typename T>
__device__ __forceinline__ void gemm_load_w(const dmat &w, int r, int k0, int h, T *dst)
{
    int k = k0 + h * 16;
    if (r >= w.rows) {
#pragma unroll
        for (int i = 0; i < 16; i++) dst[i] = to_t<T>(0.f);
        return;
    }
    if (WT == WT_Q8_0) {
        const int8_t *q = (const int8_t *)w.qs + (size_t)r * w.cols + k;
        float d = __half2float(w.d[(size_t)r * (w.cols / 32) + k0 / 32]);
        uint4 v = ldg16(q);
        const int8_t *b = (const int8_t *)&v;
#pragma unroll
        for (int i = 0; i < 16; i++) dst[i] = to_t<T>(d * b[i]);
    } else if (WT == WT_Q4_0) {
        const uint8_t *q = (const uint8_t *)w.qs + (size_t)r * (w.cols / 2) + (k0 / 32) * 16;
        float d = __half2float(w.d[(size_t)r * (w.cols / 32) + k0 / 32]);
        uint4 v = ldg16(q);
        const uint8_t *b = (const uint8_t *)&v;
#pragma unroll
        for (int i = 0; i < 16; i++) dst[i] = to_t<T>(d * ((h ? b[i] >> 4 : b[i] & 15) - 8));
    } else if (kq_is_block(WT)) { /* k_quant.cuh types: quant.c's values, then rounded to T */
        struct kq_planes p = dmat_planes(w);
        float f[16];
        kq_deq16(WT, &p, r, w.cols, k, f);
#pragma unroll
        for (int i = 0; i < 16; i++) dst[i] = to_t<T>(f[i]);
    } else { /* F16 / BF16: copy, converting to T where the types differ (never: T matches) */
        const uint16_t *src = (const uint16_t *)w.qs + (size_t)r * w.ld + k;
        if (k + 16 <= w.cols) {
            uint4 a = ldg16(src), b = ldg16(src + 8);
            *(uint4 *)dst = a;
            *(uint4 *)(dst + 8) = b;
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++) {
                uint16_t bits = k + i < w.cols ? src[i] : 0;
                dst[i] = *(const T *)&bits;
            }
        }
    }
}

template <int WT, typename T>
__device__ __forceinline__ void gemm_tile(const dmat &w, const float *x, float *y, int ntok)
{
    using namespace nvcuda;
    __shared__ __align__(32) T As[GEMM_BM * GEMM_LD];
    __shared__ __align__(32) T Bs[GEMM_BN * GEMM_LD];
    __shared__ __align__(32) float Cs[GEMM_BN * (GEMM_BM + 4)];
    int tid = threadIdx.x, warp = tid >> 5;
    int row0 = blockIdx.x * GEMM_BM, tok0 = blockIdx.y * GEMM_BN;
    int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    bool xvec = (w.cols & 3) == 0;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.f);

    int m = tid >> 1, h = tid & 1; /* this thread's row of each tile and its 16-column half */
    for (int k0 = 0; k0 < w.cols; k0 += GEMM_BK) {
        gemm_load_w<WT, T>(w, row0 + m, k0, h, As + m * GEMM_LD + h * 16);
        int t = tok0 + m, k = k0 + h * 16;
        T *bd = Bs + m * GEMM_LD + h * 16;
        if (t < ntok && xvec && k + 16 <= w.cols) {
            const float4 *xs = (const float4 *)(x + (size_t)t * w.cols + k);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 v = __ldg(xs + i);
                bd[4 * i] = to_t<T>(v.x), bd[4 * i + 1] = to_t<T>(v.y);
                bd[4 * i + 2] = to_t<T>(v.z), bd[4 * i + 3] = to_t<T>(v.w);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 16; i++)
                bd[i] = to_t<T>(t < ntok && k + i < w.cols ? x[(size_t)t * w.cols + k + i] : 0.f);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(a[i], As + (wm + 16 * i) * GEMM_LD + kk, GEMM_LD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(b[j], Bs + (wn + 16 * j) * GEMM_LD + kk, GEMM_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    /* C[m][n] -> Cs[n][m], then rows of y (one token) are written with m fastest: coalesced. */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(Cs + (wn + 16 * j) * (GEMM_BM + 4) + wm + 16 * i, acc[i][j],
                                    GEMM_BM + 4, wmma::mem_col_major);
    __syncthreads();
    for (int i = tid; i < GEMM_BM * GEMM_BN; i += GEMM_THREADS) {
        int mm = i % GEMM_BM, nn = i / GEMM_BM;
        if (row0 + mm < w.rows && tok0 + nn < ntok)
            y[(size_t)(tok0 + nn) * w.rows + row0 + mm] = Cs[nn * (GEMM_BM + 4) + mm];
    }
}

/* Grid: (ceil(rows / 64), ceil(ntok / 64)) blocks of 128 threads. */
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    k_gemm_f16(dmat w, const float *x, float *y, int ntok)
{
    gemm_tile<WT_F16, __half>(w, x, y, ntok);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    k_gemm_bf16(dmat w, const float *x, float *y, int ntok)
{
    gemm_tile<WT_BF16, __nv_bfloat16>(w, x, y, ntok);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    k_gemm_q8_0(dmat w, const float *x, float *y, int ntok)
{
    gemm_tile<WT_Q8_0, __half>(w, x, y, ntok);
}
extern "C" __global__ void __launch_bounds__(GEMM_THREADS)
    k_gemm_q4_0(dmat w, const float *x, float *y, int ntok)
{
    gemm_tile<WT_Q4_0, __half>(w, x, y, ntok);
}

/* The k_quant.cuh types, f16 tiles. */
#define GEMM_ENTRY_KQ(name, WT)                                                                    \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                     \
        k_gemm_##name(dmat w, const float *x, float *y, int ntok)                                  \
    {                                                                                              \
        gemm_tile<WT, __half>(w, x, y, ntok);                                                      \
    }
GEMM_ENTRY_KQ(q4_1, KQ_Q4_1)
GEMM_ENTRY_KQ(q5_0, KQ_Q5_0)
GEMM_ENTRY_KQ(q5_1, KQ_Q5_1)
GEMM_ENTRY_KQ(iq4_nl, KQ_IQ4_NL)
GEMM_ENTRY_KQ(q2_k, KQ_Q2_K)
GEMM_ENTRY_KQ(q3_k, KQ_Q3_K)
GEMM_ENTRY_KQ(q4_k, KQ_Q4_K)
GEMM_ENTRY_KQ(q5_k, KQ_Q5_K)
GEMM_ENTRY_KQ(q6_k, KQ_Q6_K)
GEMM_ENTRY_KQ(iq4_xs, KQ_IQ4_XS)
