/* k_sample: serving/engine/sampler.c on the GPU, so only the chosen token (and the generator
 * state) crosses PCIe. One 1024-thread block per row of logits.
 *
 * Greedy (temperature <= 0): argmax, lowest id on ties, as sampler_argmax: identical tokens.
 * Otherwise the CPU's steps on the same numbers: z = (logit - max) / temperature, p = exp(z).
 *  - No filter (top_k off, top_p >= 1, min_p <= 0): one draw r * sum and a walk in id order,
 *    as the CPU does (sums in double; the GPU adds per-thread chunks, so only a draw within
 *    rounding of a boundary can differ).
 *  - With filters: the candidates the CPU can keep, C = the top_k largest z (threshold found by
 *    bisection on the order-preserving integer image of z, ties kept) with p >= min_p, are
 *    compacted into shared memory, sorted by (z desc, id asc) as the CPU's qsort, and thread 0
 *    replays the CPU: first k, min_p cut, top_p prefix, draw, walk; in double, in that order.
 *    When C exceeds SAMPLE_CAP (top_p alone over a large vocabulary), top_p is applied by a mass
 *    threshold (bisection) and the walk is in id order: same distribution, but not the CPU's
 *    token for the same seed.
 * The generator is xorshift64* exactly as sampler.c (state update, >> 40, / 2^24), advanced once
 * per non-greedy draw. */
#pragma once

#define SAMPLE_CAP 4096

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
    return (float)((*s * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

__device__ __forceinline__ double block_sum_d(double v, double *red)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    if (w == 0) {
        double t = lane < nw ? red[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

/* Largest key K with f(K) >= target, f decreasing in K: the count (or mass) of candidates whose
 * value has key >= K. 32 passes over the row. */
template <bool MASS, typename Val, typename Keep>
__device__ unsigned bisect(int n, Val val, Keep keep, double target, double *red)
{
    unsigned K = 0;
    for (int bit = 31; bit >= 0; bit--) {
        unsigned cand = K | (1u << bit);
        double acc = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            if (keep(i)) {
                float v = val(i);
                if (key_of(v) >= cand) acc += MASS ? (double)v : 1.0;
            }
        acc = block_sum_d(acc, red);
        if (acc >= target) K = cand;
    }
    return K;
}

/* Argmax of the row, lowest id on ties (also the max the CPU subtracts): *chosen gets the id
 * (0 for an empty row), red[0] the value. cz and cid hold one entry per warp. */
__device__ __forceinline__ void block_argmax(const float *l, int vocab, float *cz, int *cid,
                                             double *red, int *chosen)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = tid; i < vocab; i += nth)
        if (l[i] > best || bi == 0x7fffffff) best = l[i], bi = i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ob > best || (ob == best && oi < bi) || bi == 0x7fffffff) best = ob, bi = oi;
    }
    if ((tid & 31) == 0) cz[tid >> 5] = best, cid[tid >> 5] = bi;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < nth >> 5; w++)
            if (cz[w] > cz[0] || (cz[w] == cz[0] && cid[w] < cid[0]))
                cz[0] = cz[w], cid[0] = cid[w];
        *chosen = cid[0] == 0x7fffffff ? 0 : cid[0];
        red[0] = cz[0];
    }
    __syncthreads();
}

/* Each thread holds `mine`, the mass of its chunk of ids: part[] becomes the exclusive prefix
 * sums, and thread 0 draws *total = r * (the whole mass), advancing the generator into *rng_out.
 * *chosen is -1 until a thread finds the draw in its chunk. */
__device__ __forceinline__ void draw_over_chunks(double mine, const sample_param *sp, double *part,
                                                 int *chosen, double *total,
                                                 unsigned long long *rng_out)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    part[tid] = mine;
    if (tid == 0) *chosen = -1;
    __syncthreads();
    if (tid == 0) {
        double run = 0;
        for (int i = 0; i < nth; i++) {
            double v = part[i];
            part[i] = run;
            run += v;
        }
        unsigned long long s = sp->rng;
        *total = rng_f32(&s) * run;
        *rng_out = s;
    }
    __syncthreads();
}

/* No filter: one draw over all ids and a walk in id order, as the CPU does. */
template <typename Z>
__device__ __forceinline__ void sample_unfiltered(Z zf, int vocab, sample_param *sp, double *part,
                                                  int *chosen, double *total,
                                                  unsigned long long *rng_out)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    /* id order, as the CPU when nothing is filtered */
    int chunk = (vocab + nth - 1) / nth, lo = tid * chunk, hi = min(vocab, lo + chunk);
    double mine = 0;
    for (int i = lo; i < hi; i++) mine += expf(zf(i));
    draw_over_chunks(mine, sp, part, chosen, total, rng_out);
    double acc = part[tid];
    if (*total >= acc && *total < acc + mine)
        for (int i = lo; i < hi; i++) {
            acc += expf(zf(i));
            if (*total < acc) {
                *chosen = i;
                break;
            }
        }
    __syncthreads();
    if (tid == 0) {
        sp->token = *chosen >= 0 ? *chosen : vocab - 1;
        sp->rng = *rng_out;
    }
}

/* Compact the candidates (in_c) into cz/cid, at most SAMPLE_CAP of them; returns how many there
 * are in all. */
template <typename Z, typename In>
__device__ __forceinline__ int gather_candidates(Z zf, In in_c, int vocab, float *cz, int *cid,
                                                 int *count)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    if (tid == 0) *count = 0;
    __syncthreads();
    for (int i = tid; i < vocab; i += nth)
        if (in_c(i)) {
            int at = atomicAdd(count, 1);
            if (at < SAMPLE_CAP) cz[at] = zf(i), cid[at] = i;
        }
    __syncthreads();
    return *count;
}

/* Bitonic sort of the nc candidates by (z desc, id asc), padded to a power of two. */
__device__ __forceinline__ void sort_candidates(float *cz, int *cid, int nc)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    int np = 1;
    while (np < nc) np <<= 1;
    for (int i = nc + tid; i < np; i += nth) cz[i] = -INFINITY, cid[i] = 0x7fffffff;
    __syncthreads();
    for (int size = 2; size <= np; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < np; i += nth) {
                int j = i ^ stride;
                if (j > i) {
                    /* "before": a sorts ahead of b */
                    bool a_first = cz[i] > cz[j] || (cz[i] == cz[j] && cid[i] < cid[j]);
                    bool up = (i & size) == 0;
                    if (up ? !a_first : a_first) {
                        float tz = cz[i];
                        cz[i] = cz[j], cz[j] = tz;
                        int ti = cid[i];
                        cid[i] = cid[j], cid[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
}

/* Thread 0 only: the CPU's steps on the sorted candidates, sequentially, in double: first k,
 * top_p prefix, draw, walk. */
__device__ __forceinline__ void replay_cpu(const float *cz, const int *cid, int nc, bool use_k,
                                           bool use_p, sample_param *sp)
{
    int k = nc;
    if (use_k && sp->top_k < k) k = sp->top_k;
    double sum = 0;
    for (int i = 0; i < k; i++) sum += (double)expf(cz[i]);
    if (use_p && sp->top_p > 0.f) {
        double acc = 0, target = sp->top_p * sum;
        int kept = 0;
        while (kept < k) {
            acc += (double)expf(cz[kept]);
            kept++;
            if (acc >= target) break;
        }
        k = kept;
        sum = acc;
    }
    unsigned long long s = sp->rng;
    double r = rng_f32(&s) * sum, acc = 0;
    int pick = cid[k - 1];
    for (int i = 0; i < k; i++) {
        acc += (double)expf(cz[i]);
        if (r < acc) {
            pick = cid[i];
            break;
        }
    }
    sp->token = pick;
    sp->rng = s;
}

/* Too many candidates to sort here: top_p by a mass threshold, walk in id order. */
template <typename Z, typename In>
__device__ __forceinline__ void
sample_by_mass(Z zf, In in_c, int vocab, bool use_p, sample_param *sp, const int *cid, double *red,
               double *part, int *chosen, double *total, unsigned long long *rng_out)
{
    const int tid = threadIdx.x, nth = blockDim.x;
    auto pe = [&](int i) { return expf(zf(i)); };
    double kept = 0;
    for (int i = tid; i < vocab; i += nth)
        if (in_c(i)) kept += pe(i);
    kept = block_sum_d(kept, red);
    unsigned emin = 0;
    if (use_p && sp->top_p > 0.f) emin = bisect<true>(vocab, pe, in_c, sp->top_p * kept, red);
    auto keep = [&](int i) { return in_c(i) && key_of(pe(i)) >= emin; };
    int chunk = (vocab + nth - 1) / nth, lo = tid * chunk, hi = min(vocab, lo + chunk);
    double mine = 0;
    int last = -1;
    for (int i = lo; i < hi; i++)
        if (keep(i)) mine += pe(i), last = i;
    draw_over_chunks(mine, sp, part, chosen, total, rng_out);
    double acc = part[tid];
    if (*total >= acc && *total < acc + mine) {
        for (int i = lo; i < hi; i++)
            if (keep(i)) {
                acc += pe(i);
                if (*total < acc) {
                    *chosen = i;
                    break;
                }
            }
        if (*chosen < 0) *chosen = last;
    }
    __syncthreads();
    if (tid == 0) {
        sp->token = *chosen >= 0 ? *chosen : cid[0]; /* rounding past the end: a kept id */
        sp->rng = *rng_out;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    k_sample(const float *logits, int vocab, sample_param *params)
{
    __shared__ double red[33];
    __shared__ float cz[SAMPLE_CAP];
    __shared__ int cid[SAMPLE_CAP];
    __shared__ double part[1024];
    __shared__ int count, chosen;
    __shared__ unsigned long long rng_out;
    __shared__ double total;
    sample_param *sp = params + blockIdx.x;
    const float *l = logits + (size_t)blockIdx.x * vocab;
    const float temp = sp->temperature;
    const int tid = threadIdx.x;

    block_argmax(l, vocab, cz, cid, red, &chosen);
    const float lmax = (float)red[0];
    if (!(temp > 0.f)) {
        if (tid == 0) sp->token = chosen;
        return;
    }
    __syncthreads();

    auto zf = [&](int i) { return (l[i] - lmax) / temp; };
    const bool use_k = sp->top_k > 0 && sp->top_k < vocab;
    const bool use_p = sp->top_p < 1.0f;
    const bool use_min = sp->min_p > 0.f;
    auto all = [&](int) { return true; };

    if (!use_k && !use_p && !use_min) {
        sample_unfiltered(zf, vocab, sp, part, &chosen, &total, &rng_out);
        return;
    }

    /* C: top_k by threshold (ties kept), then p >= min_p */
    unsigned kmin = 0;
    if (use_k) kmin = bisect<false>(vocab, zf, all, (double)sp->top_k, red);
    const float min_p = use_min ? sp->min_p : 0.f;
    auto in_c = [&](int i) {
        float z = zf(i);
        return key_of(z) >= kmin && (!use_min || expf(z) >= min_p);
    };
    const int nc = gather_candidates(zf, in_c, vocab, cz, cid, &count);

    if (nc <= SAMPLE_CAP) {
        sort_candidates(cz, cid, nc);
        if (tid == 0) replay_cpu(cz, cid, nc, use_k, use_p, sp);
        return;
    }
    sample_by_mass(zf, in_c, vocab, use_p, sp, cid, red, part, &chosen, &total, &rng_out);
}
