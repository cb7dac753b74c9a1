/* k_embed: x[t] = row tok[t] of the embedding matrix, dequantized. Grid: one block per token. */
#pragma once

extern "C" __global__ void k_embed(dmat w, const int *tok, float *x)
{
    int t = blockIdx.x, id = tok[t];
    for (int c = threadIdx.x; c < w.cols; c += blockDim.x)
        x[(size_t)t * w.cols + c] = (id >= 0 && id < w.rows) ? dmat_get(w, id, c) : 0.f;
}
