/* k_common: types, weight-type codes (ggml numbering) and block-wide reductions. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "k_quant.cuh"

enum { WT_F32 = 0, WT_F16 = 1, WT_Q4_0 = 2, WT_Q8_0 = 8, WT_BF16 = 30 };

/* A weight matrix in device layout (see kernels.cu). Passed by value. */
struct dmat {
    const void *qs;       /* elements, or quants */
    const __half *d;      /* scales (Q8_0/Q4_0; the d plane of the k_quant.cuh types), else NULL */
    const uint8_t *e, *s; /* the e and s planes of the k_quant.cuh types, else NULL */
    int rows, cols, ld, type;
};

__device__ __forceinline__ struct kq_planes dmat_planes(const dmat &w)
{
    struct kq_planes p = {(const uint8_t *)w.qs, w.e, w.s, (const uint8_t *)w.d};
    return p;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block; every thread gets the result. `red` holds >= 33 floats. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? red[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__device__ __forceinline__ float block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? red[lane] : -INFINITY;
        t = warp_max(t);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

/* Element c of row r as f32, any type (embedding lookup, tails). */
__device__ __forceinline__ float dmat_get(const dmat &w, int r, int c)
{
    switch (w.type) {
    case WT_F32:
        return ((const float *)w.qs)[(size_t)r * w.ld + c];
    case WT_F16:
        return __half2float(((const __half *)w.qs)[(size_t)r * w.ld + c]);
    case WT_BF16:
        return bf16_bits_to_f32(((const uint16_t *)w.qs)[(size_t)r * w.ld + c]);
    case WT_Q8_0: {
        float d = __half2float(w.d[(size_t)r * (w.cols / 32) + c / 32]);
        return d * ((const int8_t *)w.qs)[(size_t)r * w.cols + c];
    }
    case WT_Q4_0: {
        float d = __half2float(w.d[(size_t)r * (w.cols / 32) + c / 32]);
        const uint8_t *b = (const uint8_t *)w.qs + (size_t)r * (w.cols / 2) + (c / 32) * 16;
        int j = c % 32;
        int q = j < 16 ? (b[j] & 15) : (b[j - 16] >> 4);
        return d * (q - 8);
    }
    }
    if (kq_is_block(w.type)) {
        struct kq_planes p = dmat_planes(w);
        float f[16];
        kq_deq16(w.type, &p, r, w.cols, c & ~15, f);
        return f[c & 15];
    }
    return 0.f;
}
