/* fwd_kernels: the forward pass's vector kernels other than the matrix products, with the same
 * run-time choice of SIMD as matmul.h (the engine asks for the ISA its matmul context chose).
 *
 * attend: one token's attention over positions 0..pos of its sequence in the paged cache, for
 * query heads [h0, h1): out[h] = softmax(q[h] . K[0..pos] * scale) V[0..pos], where head h
 * reads kv head h / group. att is scratch: fwd_att_floats(ctx) floats for each head of the call.
 * The cache holds f32 or f16 (kv->type); attend reads either, kv_store writes one position's
 * keys and values (kv_dim floats each) into the cache in its type and layout (kv_cache.h; f16:
 * round to nearest even, the same bits on every ISA). The SIMD attention wants head sizes and
 * block sizes that are multiples of its vector width (8 floats for AVX2, 16 for AVX-512, 4 for
 * NEON): other shapes run the plain C kernel.
 * swiglu: g[i] = silu(g[i]) * u[i] for i < n.
 * A token's result depends only on its own inputs (not on the batch, the threads, or which heads
 * the caller groups into one call), so batched and one-by-one decoding agree exactly. The SIMD
 * kernels' exp is a polynomial within 2 ulp of expf and they sum in a different order than the
 * scalar ones: ISAs agree within float rounding (the tests compare them). */
#ifndef STRATA_FWD_KERNELS_H
#define STRATA_FWD_KERNELS_H

#include "serving/engine/kv_cache.h"

#include <stddef.h>

struct attn_args {
    const float *q; /* the token's queries: n_heads x hd */
    float *out;     /* its attention output: n_heads x hd */
    float *att;     /* scratch: (h1 - h0) x fwd_att_floats(ctx) */
    int ctx;        /* the longest context (what att's rows are sized for) */
    const struct kv_cache *kv;
    int layer;
    const int *blocks; /* the sequence's block table */
    int pos;           /* the token's position: it attends to 0..pos */
    int group, hd;     /* query heads per kv head; floats per head */
    float scale;       /* 1 / sqrt(hd) */
};

struct fwd_kernels {
    const char *name;
    void (*attend)(const struct attn_args *a, int h0, int h1);
    void (*kv_store)(const struct kv_cache *kv, int layer, int block, int slot, const float *k,
                     const float *v);
    void (*swiglu)(float *g, const float *u, int n);
};

/* The kernels for "avx512", "avxvnni" (AVX2's), "avx2", "i8mm", "dotprod", "neon" or "scalar" (matmul_isa_of's
 * names, the three NEON ones the same code); scalar for any other.
 * The caller asks only for an ISA the CPU has (matmul_isa names the best one). */
const struct fwd_kernels *fwd_kernels_for(const char *isa);

/* Internal: the plain C attention, which the SIMD tables use for shapes their registers do not
 * cover, and the plain C store (the tests fill caches with it). */
void fwd_attend_scalar(const struct attn_args *a, int h0, int h1);
void fwd_kv_store_scalar(const struct kv_cache *kv, int layer, int block, int slot, const float *k,
                         const float *v);

/* Which attention the engine runs (engine_limits.attn). ATTN_EXACT: the kernels above (exact
 * two-pass softmax in f32 over the cache's keys and values). ATTN_GGML: fwd_attend_ggml, what
 * llama.cpp's default CPU flash attention computes (fwd_attn_ggml.c: the query rounded to f16,
 * an online softmax and, with an f16 cache, an f16 accumulator of the values), in plain C on
 * every ISA: for reproducing llama.cpp's greedy text, not for speed. */
enum attn_mode { ATTN_DEFAULT, ATTN_EXACT, ATTN_GGML };
/* "exact" or "ggml-fa" -> the mode; ATTN_DEFAULT for anything else. */
int attn_mode_parse(const char *s);
const char *attn_mode_name(int mode);
void fwd_attend_ggml(const struct attn_args *a, int h0, int h1);

/* Scratch floats attend needs for a context of ctx positions (rounded up to whole vectors). */
static inline size_t fwd_att_floats(int ctx)
{
    return ((size_t)ctx + 15) / 16 * 16;
}

#endif
