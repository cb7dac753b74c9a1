/* k_pointwise: RMSNorm, q/k/v biases and per-head q/k norms, RoPE, SwiGLU, residual add, KV-cache
 * store. Each is a short pass over activations; none of them matters for bandwidth next to the
 * matmuls. */
#pragma once

/* out[i] = x[src] * w / rms(x[src]), src = rows ? rows[i] : i. Grid: one block per output row.
 * Summation in f32 like the CPU; the order differs, which the tolerance covers. */
extern "C" __global__ void k_rmsnorm(const float *x, const float *w, float *out, int dim, float eps,
                                     const int *rows)
{
    __shared__ float red[33];
    int i = blockIdx.x, src = rows ? rows[i] : i;
    const float *xr = x + (size_t)src * dim;
    float *o = out + (size_t)i * dim;
    float ss = 0.f;
    if ((dim & 3) == 0) { /* rows 16-byte aligned: a float4 a thread (dim 4096: one each) */
        const float4 *x4 = (const float4 *)xr;
        for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
            float4 v = x4[c];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_sum(ss, red);
        float scale = 1.0f / sqrtf(ss / dim + eps);
        const float4 *w4 = (const float4 *)w;
        for (int c = threadIdx.x; c < dim / 4; c += blockDim.x) {
            float4 v = x4[c], g = w4[c];
            ((float4 *)o)[c] = make_float4(g.x * (scale * v.x), g.y * (scale * v.y),
                                           g.z * (scale * v.z), g.w * (scale * v.w));
        }
        return;
    }
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf(ss / dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = w[c] * (scale * xr[c]);
}

/* What comes between the q/k/v projections and RoPE in qwen2 (and llama files with biases) and
 * qwen3: q, k, v += their biases (NULL: none), then each head of q and k RMS-normalised over its
 * hd elements and scaled by q_norm / k_norm (NULL: none), as the CPU does (engine.c). Grid:
 * (n_tok, n_heads + n_kv_heads) blocks of one warp: block (t, h) owns q head h of token t, or k
 * head h - n_heads and the matching v head; a lane only rereads what it wrote. */
extern "C" __global__ void k_qk_prep(float *q, float *k, float *v, const float *bq, const float *bk,
                                     const float *bv, const float *q_norm, const float *k_norm,
                                     int n_heads, int n_kv_heads, int hd, float eps)
{
    int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    int is_q = h < n_heads, hh = is_q ? h : h - n_heads;
    float *x = is_q ? q + ((size_t)t * n_heads + hh) * hd : k + ((size_t)t * n_kv_heads + hh) * hd;
    const float *b = is_q ? bq : bk, *w = is_q ? q_norm : k_norm;
    if (b)
        for (int d = lane; d < hd; d += 32) x[d] += b[hh * hd + d];
    if (!is_q && bv) {
        float *vh = v + ((size_t)t * n_kv_heads + hh) * hd;
        for (int d = lane; d < hd; d += 32) vh[d] += bv[hh * hd + d];
    }
    if (!w) return;
    float ss = 0.f;
    for (int d = lane; d < hd; d += 32) ss += x[d] * x[d];
    ss = warp_sum(ss);
    float scale = 1.0f / sqrtf(ss / hd + eps);
    for (int d = lane; d < hd; d += 32) x[d] = w[d] * (scale * x[d]);
}

/* RoPE, then each token's rotated key and its value written into the paged cache at its
 * position: block bt[t][pos / bs], slot pos % bs, layer `layer` of a cache laid out
 * [layer][block][slot][kv_dim] (as the CPU's kv_cache). One launch for what would be two, since
 * both are a few microseconds of launch latency for little work.
 * Pair j of a head turns by pos * theta^(-2j/hd), divided by freq_factors[j] where given
 * (Llama 3.1's rope_freqs), times scale (linear rope scaling): the CPU's rope_angles. The pair is
 * (x[2j], x[2j+1]) (llama2.c, ggml's mode 0) or, with neox, (x[j], x[j + hd/2]) (ggml's NEOX).
 * q: n_tok x n_heads*hd (rotated in place), k, v: n_tok x kv_dim. Grid: one block per token. */
extern "C" __global__ void k_rope_store(float *q, const float *k, const float *v, float *kc,
                                        float *vc, const int *pos, const int *bt, int max_blocks,
                                        int layer, int n_blocks, int bs, int n_heads,
                                        int n_kv_heads, int hd, float theta, int neox,
                                        const float *freq_factors, float scale)
{
    int t = blockIdx.x, p = pos[t], kv_dim = n_kv_heads * hd, half = hd / 2;
    int qpairs = n_heads * half, kpairs = n_kv_heads * half;
    int blk = bt[(size_t)t * max_blocks + p / bs];
    size_t off = (((size_t)layer * n_blocks + blk) * bs + p % bs) * kv_dim;
    int first = blockIdx.y * blockDim.x + threadIdx.x, stride = gridDim.y * blockDim.x;
    for (int i = first; i < qpairs + kpairs; i += stride) {
        int pi = i < qpairs ? i : i - qpairs; /* pair index within the token's row */
        int h = pi / half, j = pi % half;     /* head, pair within the head */
        int e0 = h * hd + (neox ? j : 2 * j), e1 = e0 + (neox ? half : 1);
        float freq = 1.0f / powf(theta, (float)(2 * j) / (float)hd);
        float a = (float)p * freq;
        if (freq_factors) a /= freq_factors[j];
        a *= scale;
        float c = cosf(a), s = sinf(a);
        if (i < qpairs) {
            float *qv = q + (size_t)t * n_heads * hd;
            float v0 = qv[e0], v1 = qv[e1];
            qv[e0] = v0 * c - v1 * s;
            qv[e1] = v0 * s + v1 * c;
        } else {
            const float *kv = k + (size_t)t * kv_dim;
            float v0 = kv[e0], v1 = kv[e1];
            kc[off + e0] = v0 * c - v1 * s;
            kc[off + e1] = v0 * s + v1 * c;
        }
    }
    for (int c = first; c < kv_dim; c += stride) vc[off + c] = v[(size_t)t * kv_dim + c];
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
