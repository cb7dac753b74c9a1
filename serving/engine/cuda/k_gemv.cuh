/* k_gemv: y[t][r] = sum_c W[r][c] x[t][c] for a few tokens (decode). Bandwidth-bound: every
 * weight byte is read once per call, so the design is about keeping HBM busy:
 *   - one warp per row (half a warp for Q4_0, see gemv_q4_0), 8 warps per 256-thread block,
 *     enough blocks to fill every SM; q, k and v (or gate and up) share one launch;
 *   - 16-byte non-coherent loads (ld.global.nc.v4) of weights, GEMV_UNROLL of them issued per
 *     lane before any is used, so each lane has 64+ bytes in flight;
 *   - x is small and re-read by every warp from L1/L2; the dot runs in f32 (more exact than the
 *     CPU's Q8 activations, so CPU/GPU differences stay within the stated tolerance).
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

/* Q8_0: a lane takes whole blocks: 32 int8 (two 16-byte loads) and one f16 scale. */
template <int NT>
__device__ __forceinline__ void gemv_q8_0(const dmat &w, int r, const float *x, int nt, float *acc)
{
    int lane = threadIdx.x & 31;
    int nb = w.cols / 32;
    const int8_t *row = (const int8_t *)w.qs + (size_t)r * w.cols;
    const __half *dr = w.d + (size_t)r * nb;
    for (int b0 = lane; b0 < nb; b0 += 32 * GEMV_UNROLL) {
        uint4 q[GEMV_UNROLL][2];
        float d[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int b = b0 + 32 * u;
            if (b < nb) {
                q[u][0] = ldg16(row + (size_t)b * 32);
                q[u][1] = ldg16(row + (size_t)b * 32 + 16);
                d[u] = __half2float(dr[b]);
            } else {
                q[u][0] = q[u][1] = make_uint4(0, 0, 0, 0);
                d[u] = 0.f;
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int b = b0 + 32 * u;
            if (b >= nb) break;
            const int8_t *qb = (const int8_t *)q[u];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const float4 *xt = (const float4 *)(x + (size_t)t * w.cols + b * 32);
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 a = __ldg(xt + i);
                    s = fmaf((float)qb[4 * i], a.x, s);
                    s = fmaf((float)qb[4 * i + 1], a.y, s);
                    s = fmaf((float)qb[4 * i + 2], a.z, s);
                    s = fmaf((float)qb[4 * i + 3], a.w, s);
                }
                acc[t] = fmaf(d[u], s, acc[t]);
            }
        }
    }
}

/* Q4_0: one 16-byte load is one whole block; low nibbles are elements 0..15, high 16..31.
 * Half a warp per row (GEMV_Q4_LANES): 18 weight bytes per block against 128 bytes of x, so the
 * two half-warps of a warp read the same x addresses in the same instruction and L1 serves them
 * once, halving x traffic, which would otherwise approach L1's limit before HBM's. Twice the
 * unroll keeps the bytes in flight per lane. */
#define GEMV_Q4_LANES  16
#define GEMV_Q4_UNROLL 8
template <int NT>
__device__ __forceinline__ void gemv_q4_0(const dmat &w, int r, const float *x, int nt, float *acc)
{
    int lane = threadIdx.x & (GEMV_Q4_LANES - 1);
    int nb = w.cols / 32;
    const uint8_t *row = (const uint8_t *)w.qs + (size_t)r * (w.cols / 2);
    const __half *dr = w.d + (size_t)r * nb;
    for (int b0 = lane; b0 < nb; b0 += GEMV_Q4_LANES * GEMV_Q4_UNROLL) {
        uint4 q[GEMV_Q4_UNROLL];
        float d[GEMV_Q4_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_Q4_UNROLL; u++) {
            int b = b0 + GEMV_Q4_LANES * u;
            q[u] = b < nb ? ldg16(row + (size_t)b * 16) : make_uint4(0, 0, 0, 0);
            d[u] = b < nb ? __half2float(dr[b]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < GEMV_Q4_UNROLL; u++) {
            int b = b0 + GEMV_Q4_LANES * u;
            if (b >= nb) break;
            const uint8_t *qb = (const uint8_t *)&q[u];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const float4 *xt = (const float4 *)(x + (size_t)t * w.cols + b * 32);
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 lo = __ldg(xt + i), hi = __ldg(xt + 4 + i);
                    s = fmaf((float)((qb[4 * i] & 15) - 8), lo.x, s);
                    s = fmaf((float)((qb[4 * i + 1] & 15) - 8), lo.y, s);
                    s = fmaf((float)((qb[4 * i + 2] & 15) - 8), lo.z, s);
                    s = fmaf((float)((qb[4 * i + 3] & 15) - 8), lo.w, s);
                    s = fmaf((float)((qb[4 * i] >> 4) - 8), hi.x, s);
                    s = fmaf((float)((qb[4 * i + 1] >> 4) - 8), hi.y, s);
                    s = fmaf((float)((qb[4 * i + 2] >> 4) - 8), hi.z, s);
                    s = fmaf((float)((qb[4 * i + 3] >> 4) - 8), hi.w, s);
                }
                acc[t] = fmaf(d[u], s, acc[t]);
            }
        }
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

/* Lanes that share one row: a whole warp, or half of one for Q4_0. */
template <int WT> struct gemv_lanes {
    static const int n = WT == WT_Q4_0 ? GEMV_Q4_LANES : 32;
};

template <int WT, int NT>
__device__ __forceinline__ void gemv_row(const dmat &w, int r, const float *x, int nt, float *acc)
{
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    if (WT == WT_Q8_0)
        gemv_q8_0<NT>(w, r, x, nt, acc);
    else if (WT == WT_Q4_0)
        gemv_q4_0<NT>(w, r, x, nt, acc);
    else
        gemv_dense<WT, NT>(w, r, x, nt, acc);
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int o = gemv_lanes<WT>::n / 2; o > 0; o >>= 1)
            acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
}

template <int WT, int NT>
__device__ __forceinline__ void gemv_entry(const gemv_args &a, const float *x, int nt)
{
    const int L = gemv_lanes<WT>::n, per_warp = 32 / L;
    int lane = threadIdx.x & 31, total = a.rows_end[a.n_mats - 1];
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp * per_warp >= total) return; /* warp-uniform */
    int g = warp * per_warp + lane / L;
    /* A half-warp past the last row computes a copy of it (its lanes must join the shuffles)
     * and writes nothing. */
    bool valid = g < total;
    if (!valid) g = total - 1;
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
    if ((lane & (L - 1)) == 0 && valid)
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

/* Entry points: k_gemv_<type>_<NT>(args, x, nt). Grid: ceil(total rows / rows per block) blocks
 * of 256: 8 rows per block, 16 for Q4_0 (cuda_plan.h cuda_gemv_blocks). */
#define GEMV_ENTRY(name, WT, NT)                                                                   \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                     \
        k_gemv_##name##_##NT(gemv_args a, const float *x, int nt)                                  \
    {                                                                                              \
        gemv_entry<WT, NT>(a, x, nt);                                                              \
    }
#define GEMV_ALL(NT)                                                                               \
    GEMV_ENTRY(f32, WT_F32, NT)                                                                    \
    GEMV_ENTRY(f16, WT_F16, NT)                                                                    \
    GEMV_ENTRY(bf16, WT_BF16, NT)                                                                  \
    GEMV_ENTRY(q8_0, WT_Q8_0, NT)                                                                  \
    GEMV_ENTRY(q4_0, WT_Q4_0, NT)
GEMV_ALL(1)
GEMV_ALL(2)
GEMV_ALL(4)
GEMV_ALL(8)
