/* k_gemv: y[t][r] = sum_c W[r][c] x[t][c] for a few tokens (decode) with F32, F16 or BF16
 * weights (the block types have k_gemvq.cuh). Bandwidth-bound: every weight byte is read once
 * per call, so the design is about keeping HBM busy:
 *   - one warp per row, 8 warps per 256-thread block, enough blocks to fill every SM; q, k and v
 *     (or gate and up) share one launch;
 *   - 16-byte non-coherent loads (ld.global.nc.v4) of weights, GEMV_UNROLL of them issued per
 *     lane before any is used, so each lane has 64+ bytes in flight;
 *   - x is small and re-read by every warp from L1/L2; the dot runs in f32, as the CPU's does for
 *     these types.
 * NT (1, 2, 4 or 8) tokens share each weight load; nt <= NT are valid. */
#pragma once

#define GEMV_THREADS 256
#define GEMV_UNROLL  4

__device__ __forceinline__ uint4 ldg16(const void *p)
{
    return __ldg((const uint4 *)p);
}

/* 8 consecutive x values from c (c + 8 <= cols). */
__device__ __forceinline__ void load_x8(const float *x, int c, bool vec, float *o)
{
    if (vec) {
        float4 a = __ldg((const float4 *)(x + c)), b = __ldg((const float4 *)(x + c + 4));
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z,
        o[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = __ldg(x + c + i);
    }
}

/* Each gemv_<type> adds this lane's share of row r's dot products with the nt token rows of x
 * into acc[t]; the caller reduces over the warp. */

/* F16, BF16 and F32 rows: chunks of 16 bytes (8 halves or 4 floats). */
template <int WT, int NT>
__device__ __forceinline__ void gemv_dense(const dmat &w, int r, const float *x, int nt, float *acc)
{
    int lane = threadIdx.x & 31;
    const int per = WT == WT_F32 ? 4 : 8; /* elements per 16-byte chunk */
    const uint8_t *row = (const uint8_t *)w.qs + (size_t)r * w.ld * (WT == WT_F32 ? 4 : 2);
    int nfull = w.cols / per; /* chunks entirely inside cols */
    bool vec = (w.cols & 3) == 0;
    for (int c0 = lane; c0 < nfull; c0 += 32 * GEMV_UNROLL) {
        uint4 q[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + 32 * u;
            q[u] = c < nfull ? ldg16(row + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + 32 * u;
            if (c >= nfull) break;
            float wf[8];
            const uint32_t *qw = (const uint32_t *)&q[u];
            if (WT == WT_F32) {
#pragma unroll
                for (int i = 0; i < 4; i++) wf[i] = __uint_as_float(qw[i]);
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint32_t v = qw[i];
                    if (WT == WT_F16) {
                        float2 f = __half22float2(*(const __half2 *)&v);
                        wf[2 * i] = f.x, wf[2 * i + 1] = f.y;
                    } else {
                        wf[2 * i] = __uint_as_float(v << 16);
                        wf[2 * i + 1] = __uint_as_float(v & 0xffff0000u);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const float *xt = x + (size_t)t * w.cols + c * per;
                float s = 0.f;
                if (WT == WT_F32) {
                    float xv[4];
                    if (vec) {
                        float4 a = __ldg((const float4 *)xt);
                        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; i++) xv[i] = __ldg(xt + i);
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) s = fmaf(wf[i], xv[i], s);
                } else {
                    float xv[8];
                    load_x8(xt, 0, vec, xv);
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(wf[i], xv[i], s);
                }
                acc[t] += s;
            }
        }
    }
    /* The ragged end of the row (cols not a multiple of the chunk). */
    for (int c = nfull * per + lane; c < w.cols; c += 32) {
        float wv = dmat_get(w, r, c);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) acc[t] += wv * x[(size_t)t * w.cols + c];
    }
}

/* One launch for up to 3 matrices with the same type and input (q, k, v), or a fused epilogue:
 *   GEMV_STORE  y_i[t][r] = W_i x_t
 *   GEMV_ADD    y_0[t][r] += W_0 x_t                      (wo, ffn_down: the residual add)
 *   GEMV_SWIGLU y_0[t][r] = silu(W_0 x_t) * (W_1 x_t)     (ffn_gate and ffn_up, one warp per row)
 * Warps are numbered across the matrices' rows (rows_end: running totals). */
enum { GEMV_STORE = 0, GEMV_ADD = 1, GEMV_SWIGLU = 2 };

struct gemv_args {
    dmat w[3];
    float *y[3];
    int rows_end[3];
    int n_mats, mode;
};

template <int WT, int NT>
__device__ __forceinline__ void gemv_row(const dmat &w, int r, const float *x, int nt, float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    gemv_dense<WT, NT>(w, r, x, nt, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
}

template <int WT, int NT>
__device__ __forceinline__ void gemv_entry(const gemv_args &a, const float *x, int nt)
{
    int lane = threadIdx.x & 31, total = a.rows_end[a.n_mats - 1];
    int g = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; /* this warp's row */
    if (g >= total) return;                               /* warp-uniform */
    int i = g < a.rows_end[0] ? 0 : g < a.rows_end[1] ? 1 : 2;
    int r = g - (i == 0 ? 0 : a.rows_end[i - 1]);
    const dmat &w = i == 0 ? a.w[0] : i == 1 ? a.w[1] : a.w[2];
    float *y = i == 0 ? a.y[0] : i == 1 ? a.y[1] : a.y[2];
    float acc[NT];
    gemv_row<WT, NT>(w, r, x, nt, acc);
    if (a.mode == GEMV_SWIGLU) {
        float up[NT];
        gemv_row<WT, NT>(a.w[1], r, x, nt, up);
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

/* Entry points: k_gemv_<type>_<NT>(args, x, nt). Grid: ceil(total rows / 8) blocks of 256
 * (cuda_plan.h cuda_gemv_blocks). */
#define GEMV_ENTRY(name, WT, NT)                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                     \
        k_gemv_##name##_##NT(gemv_args a, const float *x, int nt)                                  \
    {                                                                                              \
        gemv_entry<WT, NT>(a, x, nt);                                                              \
    }
#define GEMV_ALL(NT)                                                                               \
    GEMV_ENTRY(f32, WT_F32, NT)                                                                    \
    GEMV_ENTRY(f16, WT_F16, NT)                                                                    \
    GEMV_ENTRY(bf16, WT_BF16, NT)
GEMV_ALL(1)
GEMV_ALL(2)
GEMV_ALL(4)
GEMV_ALL(8)
