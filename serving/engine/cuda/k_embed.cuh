/* k_embed: x[t] = row tok[t] of the embedding matrix, dequantized (bit-identical to quant.c's
 * dequantize_row for every type). Grid: one block per token; the k_quant.cuh types go 16
 * elements a thread, the others one. */
#pragma once

extern "C" __global__ void k_embed(dmat w, const int *tok, float *x)
{
    int t = blockIdx.x, id = tok[t];
    bool ok = id >= 0 && id < w.rows;
    float *xr = x + (size_t)t * w.cols;
    if (kq_is_block(w.type)) {
        struct kq_planes p = dmat_planes(w);
        for (int c = 16 * threadIdx.x; c < w.cols; c += 16 * blockDim.x) {
            float f[16];
            if (ok)
                kq_deq16(w.type, &p, id, w.cols, c, f);
            else
#pragma unroll
                for (int i = 0; i < 16; i++) f[i] = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i += 4)
                *(float4 *)(xr + c + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
        }
        return;
    }
    for (int c = threadIdx.x; c < w.cols; c += blockDim.x) xr[c] = ok ? dmat_get(w, id, c) : 0.f;
}
