/* k_sample: the sampler on the GPU, so only the chosen token (and the generator state) crosses
 * PCIe. One 1024-thread block per row of logits.
 *
 * Greedy (temperature 0): argmax, lowest id on ties: the CPU sampler's rule, so greedy tokens are
 * identical. Otherwise, as serving/engine/sampler.h orders it: logits / temperature; top_k by a
 * threshold (the k-th largest, found by bisection on the order-preserving integer image of the
 * floats, 32 counting passes); softmax; min_p drops e < min_p * e_max; top_p keeps the largest
 * values whose mass reaches top_p (bisection again); then one draw from the xorshift64* generator
 * (llama2.c's random_f32: same state update, same 24-bit mantissa) scaled by the kept mass, and
 * a walk in id order. Bisection keeps ties at a threshold (a set may exceed k by the tied
 * values); the CPU walks in its own order, so stochastic draws share the generator and the
 * distribution, not necessarily the token. */
#pragma once

struct sample_param {
    float temperature, top_p, min_p;
    int top_k;
    unsigned long long rng; /* in: state before the draw; out: after */
    int token;              /* out */
    int pad;
};

__device__ __forceinline__ unsigned key_of(float f)
{
    unsigned b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float rng_f32(unsigned long long *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    unsigned r = (unsigned)((*s * 0x2545F4914F6CDD1Dull) >> 32);
    return (r >> 8) / 16777216.0f;
}

/* Largest key K with f(K) >= target, f monotone decreasing in K: count or mass of values whose
 * key is >= K. `val(i)` gives element i's value, `keep(i)` whether it is still a candidate. */
template <typename Val, typename Keep, bool MASS>
__device__ unsigned bisect(int n, Val val, Keep keep, float target, float *red)
{
    unsigned K = 0;
    for (int bit = 31; bit >= 0; bit--) {
        unsigned cand = K | (1u << bit);
        float acc = 0.f;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (keep(i)) {
                float v = val(i);
                if (key_of(v) >= cand) acc += MASS ? v : 1.f;
            }
        acc = block_sum(acc, red);
        if (acc >= target) K = cand;
    }
    return K;
}

extern "C" __global__ void __launch_bounds__(1024)
    k_sample(const float *logits, int vocab, sample_param *params)
{
    __shared__ float red[33];
    __shared__ float part[1024];
    __shared__ int chosen;
    sample_param *sp = params + blockIdx.x;
    const float *l = logits + (size_t)blockIdx.x * vocab;
    float temp = sp->temperature;

    if (!(temp > 0.f)) { /* greedy */
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            if (l[i] > best || (l[i] == best && i < bi)) best = l[i], bi = i;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = best, ((int *)red)[threadIdx.x >> 5] = bi;
        __syncthreads();
        if (threadIdx.x == 0) {
            int nw = blockDim.x >> 5, id = ((int *)red)[0];
            float b = part[0];
            for (int w = 1; w < nw; w++) {
                int wi = ((int *)red)[w];
                if (part[w] > b || (part[w] == b && wi < id)) b = part[w], id = wi;
            }
            sp->token = id == 0x7fffffff ? 0 : id;
        }
        return;
    }

    float inv_t = 1.0f / temp;
    auto lt = [&](int i) { return l[i] * inv_t; };
    auto all = [&](int) { return true; };
    unsigned kmin = 0; /* keep logits with key >= kmin */
    if (sp->top_k > 0 && sp->top_k < vocab)
        kmin = bisect<decltype(lt), decltype(all), false>(vocab, lt, all, (float)sp->top_k, red);
    auto in_k = [&](int i) { return key_of(lt(i)) >= kmin; };

    float m = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (in_k(i)) m = fmaxf(m, lt(i));
    m = block_max(m, red);
    /* e_i = exp(l_i - max): p_i = e_i / sum, and p_max corresponds to e = 1. */
    auto ex = [&](int i) { return expf(lt(i) - m); };
    float min_e = sp->min_p > 0.f ? sp->min_p : 0.f;
    auto in_kp = [&](int i) { return in_k(i) && ex(i) >= min_e; };
    float kept = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (in_kp(i)) kept += ex(i);
    kept = block_sum(kept, red);
    unsigned emin = 0;
    if (sp->top_p > 0.f && sp->top_p < 1.f)
        emin = bisect<decltype(ex), decltype(in_kp), true>(vocab, ex, in_kp, sp->top_p * kept, red);
    auto final_keep = [&](int i) { return in_kp(i) && key_of(ex(i)) >= emin; };

    /* Contiguous id ranges per thread, an exclusive scan of their masses, one walk. */
    int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
    float mine = 0.f;
    int last = -1;
    for (int i = lo; i < hi; i++)
        if (final_keep(i)) mine += ex(i), last = i;
    part[threadIdx.x] = mine;
    if (threadIdx.x == 0) chosen = -1;
    __syncthreads();
    __shared__ float base_total[2];
    __shared__ unsigned long long rng_out;
    if (threadIdx.x == 0) {
        float run = 0.f;
        for (int i = 0; i < (int)blockDim.x; i++) {
            float v = part[i];
            part[i] = run;
            run += v;
        }
        unsigned long long s = sp->rng;
        float r = rng_f32(&s);
        rng_out = s;
        base_total[0] = r * run;
        base_total[1] = run;
    }
    __syncthreads();
    float target = base_total[0], cum = part[threadIdx.x];
    if (target >= cum && target < cum + mine) {
        for (int i = lo; i < hi; i++)
            if (final_keep(i)) {
                cum += ex(i);
                if (target < cum) {
                    chosen = i;
                    break;
                }
            }
        if (chosen < 0) chosen = last; /* rounding at the end of the range */
    }
    __syncthreads();
    if (chosen < 0) { /* target landed past the total by rounding: the last kept id */
        int lk = last;
        for (int o = 16; o > 0; o >>= 1) lk = max(lk, __shfl_xor_sync(0xffffffffu, lk, o));
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = (float)lk;
        __syncthreads();
        if (threadIdx.x == 0) {
            int b = -1;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) b = max(b, (int)part[w]);
            chosen = b < 0 ? 0 : b;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        sp->token = chosen;
        sp->rng = rng_out;
    }
}
