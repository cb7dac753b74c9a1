/* k_gemv: y[t][r] = sum_c W[r][c] x[t][c] for a few tokens (decode). Bandwidth-bound: every
 * weight byte is read once per call, so the design is about keeping HBM busy:
 *   - one warp per row, GEMV_ROWS rows per 256-thread block, enough blocks to fill every SM;
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

/* Write the warp's sums. */
template <int NT>
__device__ __forceinline__ void gemv_store(float *acc, float *y, int r, int rows, int nt, int lane)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[(size_t)t * rows + r] = s;
    }
}

/* F16, BF16 and F32 rows: chunks of 16 bytes (8 halves or 4 floats). */
template <int WT, int NT>
__device__ __forceinline__ void gemv_dense(const dmat &w, const float *x, float *y, int nt)
{
    int lane = threadIdx.x & 31;
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    const int per = WT == WT_F32 ? 4 : 8; /* elements per 16-byte chunk */
    const uint8_t *row = (const uint8_t *)w.qs + (size_t)r * w.ld * (WT == WT_F32 ? 4 : 2);
    int nfull = w.cols / per; /* chunks entirely inside cols */
    bool vec = (w.cols & 3) == 0;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
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
    gemv_store<NT>(acc, y, r, w.rows, nt, lane);
}

/* Q8_0: a lane takes whole blocks: 32 int8 (two 16-byte loads) and one f16 scale. */
template <int NT>
__device__ __forceinline__ void gemv_q8_0(const dmat &w, const float *x, float *y, int nt)
{
    int lane = threadIdx.x & 31;
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    int nb = w.cols / 32;
    const int8_t *row = (const int8_t *)w.qs + (size_t)r * w.cols;
    const __half *dr = w.d + (size_t)r * nb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
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
    gemv_store<NT>(acc, y, r, w.rows, nt, lane);
}

/* Q4_0: one 16-byte load is one whole block; low nibbles are elements 0..15, high 16..31. */
template <int NT>
__device__ __forceinline__ void gemv_q4_0(const dmat &w, const float *x, float *y, int nt)
{
    int lane = threadIdx.x & 31;
    int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (r >= w.rows) return;
    int nb = w.cols / 32;
    const uint8_t *row = (const uint8_t *)w.qs + (size_t)r * (w.cols / 2);
    const __half *dr = w.d + (size_t)r * nb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int b0 = lane; b0 < nb; b0 += 32 * GEMV_UNROLL) {
        uint4 q[GEMV_UNROLL];
        float d[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int b = b0 + 32 * u;
            q[u] = b < nb ? ldg16(row + (size_t)b * 16) : make_uint4(0, 0, 0, 0);
            d[u] = b < nb ? __half2float(dr[b]) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int b = b0 + 32 * u;
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
    gemv_store<NT>(acc, y, r, w.rows, nt, lane);
}

/* Entry points: k_gemv_<type>_<NT>(w, x, y, nt). Grid: ceil(rows / 8) blocks of 256. */
#define GEMV_ENTRY(name, call, NT)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                     \
        k_gemv_##name##_##NT(dmat w, const float *x, float *y, int nt)                             \
    {                                                                                              \
        call;                                                                                      \
    }
#define GEMV_ALL(NT)                                                                               \
    GEMV_ENTRY(f32, (gemv_dense<WT_F32, NT>(w, x, y, nt)), NT)                                     \
    GEMV_ENTRY(f16, (gemv_dense<WT_F16, NT>(w, x, y, nt)), NT)                                     \
    GEMV_ENTRY(bf16, (gemv_dense<WT_BF16, NT>(w, x, y, nt)), NT)                                   \
    GEMV_ENTRY(q8_0, gemv_q8_0<NT>(w, x, y, nt), NT)                                               \
    GEMV_ENTRY(q4_0, gemv_q4_0<NT>(w, x, y, nt), NT)
GEMV_ALL(1)
GEMV_ALL(2)
GEMV_ALL(4)
GEMV_ALL(8)
