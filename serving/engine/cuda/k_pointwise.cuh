/* k_pointwise: RMSNorm, RoPE, SwiGLU, residual add, KV-cache store. Each is a short pass over
 * activations; none of them matters for bandwidth next to the matmuls. */
#pragma once

/* out[i] = x[src] * w / rms(x[src]), src = rows ? rows[i] : i. Grid: one block per output row.
 * Summation in f32 like the CPU; the order differs, which the tolerance covers. */
extern "C" __global__ void k_rmsnorm(const float *x, const float *w, float *out, int dim, float eps,
                                     const int *rows)
{
    __shared__ float red[33];
    int i = blockIdx.x, src = rows ? rows[i] : i;
    const float *xr = x + (size_t)src * dim;
    float ss = 0.f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf(ss / dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        out[(size_t)i * dim + c] = w[c] * (scale * xr[c]);
}

/* RoPE on interleaved pairs (x[2i], x[2i+1]) of each head, as llama2.c and ggml's mode 0:
 * angle = pos * theta^(-2i/head_dim), then each token's rotated key and its value are written
 * into the paged cache at its position: block bt[t][pos / bs], slot pos % bs, layer `layer` of a
 * cache laid out [layer][block][slot][kv_dim] (as the CPU's kv_cache). One launch for what
 * would be two, since both are a few microseconds of launch latency for little work.
 * q: n_tok x n_heads*hd (rotated in place), k, v: n_tok x kv_dim. Grid: one block per token. */
extern "C" __global__ void k_rope_store(float *q, const float *k, const float *v, float *kc,
                                        float *vc, const int *pos, const int *bt, int max_blocks,
                                        int layer, int n_blocks, int bs, int n_heads,
                                        int n_kv_heads, int hd, float theta)
{
    int t = blockIdx.x, p = pos[t], kv_dim = n_kv_heads * hd;
    int qpairs = n_heads * hd / 2, kpairs = kv_dim / 2;
    int blk = bt[(size_t)t * max_blocks + p / bs];
    size_t off = (((size_t)layer * n_blocks + blk) * bs + p % bs) * kv_dim;
    for (int i = threadIdx.x; i < qpairs + kpairs; i += blockDim.x) {
        int e = 2 * (i < qpairs ? i : i - qpairs); /* element index within the token's row */
        int j = (e % hd) / 2;                      /* pair index within the head */
        float freq = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
        float a = p * freq, c = cosf(a), s = sinf(a);
        if (i < qpairs) {
            float *qv = q + (size_t)t * n_heads * hd + e;
            float v0 = qv[0], v1 = qv[1];
            qv[0] = v0 * c - v1 * s;
            qv[1] = v0 * s + v1 * c;
        } else {
            const float *kv = k + (size_t)t * kv_dim + e;
            float v0 = kv[0], v1 = kv[1];
            kc[off + e] = v0 * c - v1 * s;
            kc[off + e + 1] = v0 * s + v1 * c;
        }
    }
    for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) vc[off + c] = v[(size_t)t * kv_dim + c];
}

/* g = silu(g) * u over n elements. */
extern "C" __global__ void k_swiglu(float *g, const float *u, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

/* x += y over n elements. */
extern "C" __global__ void k_add(float *x, const float *y, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] += y[i];
}
