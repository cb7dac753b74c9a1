/* matmul: the kernels of the forward pass, with a run-time choice of SIMD (x86-64: AVX-512, AVX2;
 * aarch64: NEON with the int8 matrix multiply, with the dot product, plain NEON; plain C).
 *
 * matmul(): y[t][r] = sum_c W[r][c] * x[t][c] for t < n_tok, r < W.rows, over the thread pool.
 * For quantized W the activations are first quantized to Q8 blocks (as ggml does) and the dot
 * products are done in integers; for n_tok > 1 the kernel tiles over tokens so each weight block
 * is read from memory once per tile, which makes prefill compute-bound, not bandwidth-bound.
 * matmul_multi() runs several matrices on the same input in one dispatch (q/k/v, gate/up).
 * Scratch for the quantized activations comes from the caller (the arena's activation pool):
 * matmul_scratch_size() says how much. Nothing here allocates after matmul_init. n_tok and the
 * column count must not exceed the max_tokens and max_cols given to matmul_init (a sizing bug:
 * it aborts). A token's outputs are bit-identical whatever the batch it comes in, the thread
 * count, and whether it goes through matmul or matmul_multi (so batched and one-by-one decoding
 * agree exactly); different ISAs agree within float rounding. */
#ifndef STRATA_MATMUL_H
#define STRATA_MATMUL_H

#include "serving/engine/model.h"
#include "serving/engine/threadpool.h"

#include <stddef.h>

struct kernel_table;

struct matmul_ctx {
    struct threadpool *tp; /* NULL: run on the calling thread */
    void *scratch;
    size_t scratch_size;
    int max_tokens, max_cols;
    const struct kernel_table *kernels; /* chosen by matmul_init (CPU and STRATA_ISA) */
};

size_t matmul_scratch_size(int max_tokens, int max_cols);
int matmul_init(struct matmul_ctx *k, struct threadpool *tp, void *scratch, int max_tokens,
                int max_cols, char *err);

void matmul(struct matmul_ctx *k, float *y, const struct tensor *w, const float *x, int n_tok);
/* y[i] gets W[i] x, for i < n (n <= 4); all W[i] have the same cols. */
void matmul_multi(struct matmul_ctx *k, int n, float *const *y, const struct tensor *const *w,
                  const float *x, int n_tok);

/* 1 if the kernels k chose are faster on t repacked (repack.h); the engine repacks such
 * tensors once at init. */
int matmul_wants_repack(const struct matmul_ctx *k, const struct tensor *t);

/* Dequantize row `row` of W (embedding lookup); any layout, repacked ones included. */
void tensor_get_row(const struct tensor *w, int row, float *out);

/* The instruction set in use: "avx512", "avxvnni", "avx2" or "scalar" on x86-64, "i8mm", "dotprod",
 * "neon" or "scalar" on aarch64. STRATA_ISA=<one of those> in the environment forces a lower one
 * (tests compare them). */
const char *matmul_isa(void);
/* The instruction set a context chose at matmul_init. */
const char *matmul_isa_of(const struct matmul_ctx *k);

#endif
