/* matmul_kernels: what matmul.c (the driver) and the per-ISA kernel files share. Internal.
 *
 * A kernel computes nr consecutive rows of W, one after another, each against nt (<= tile_t)
 * consecutive tokens: y[t*ys + r] = dot(W row r, token t). Weights are read in their stored
 * format; for quantized types the tokens come pre-quantized in the formats below. Every kernel
 * table gives the same results up to float summation order (the integer parts are
 * exact), which the tests check against the scalar table. */
#ifndef STRATA_MATMUL_KERNELS_H
#define STRATA_MATMUL_KERNELS_H

#include "serving/engine/quant.h"

#include <stddef.h>
#include <stdint.h>

/* Activations for Q8_0 and Q4_0 weights: 32 values, x ~ d*qs, plus -8*sum(qs), the correction
 * for Q4_0's implicit offset of 8. */
struct act_q8 {
    float d;
    int32_t neg8sum;
    int8_t qs[32];
};

/* Activations for Q4_K weights (like ggml's Q8_K): 256 values, x ~ d*qs, with the sums of each
 * sub-block of 32 for the mins term. */
struct act_q8k {
    float d;
    int16_t bsums[8];
    int8_t qs[256];
};

/* w: first row, ws: bytes between rows; x: first token (floats or act blocks), xs: bytes between
 * tokens; cols: elements per row; y: output of (row 0, token 0), ys: floats between tokens. */
typedef void (*tile_fn)(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs, int nt,
                        int cols, float *y, size_t ys);

enum { KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_COUNT };

struct kernel_table {
    const char *name;
    int tile_t; /* tokens per tile (registers permitting) */
    tile_fn tile[KT_COUNT];
    /* Activation quantizers; every table's give bit-identical results (same formulas). */
    void (*quant_q8)(const float *x, struct act_q8 *a, int nb);
    void (*quant_q8k)(const float *x, struct act_q8k *a, int nb);
};

/* f16 -> f32 for every half: the kernels convert one scale per block, and a table load
 * (broadcast straight from memory) is cheaper than vcvtph2ps on a scalar. Filled by
 * matmul_init. */
extern float matmul_f16_table[1 << 16];

void quantize_act_q8(const float *x, struct act_q8 *a, int nb);
void quantize_act_q8k(const float *x, struct act_q8k *a, int nb);

extern const struct kernel_table kernels_scalar;
extern const struct kernel_table kernels_avx2;
extern const struct kernel_table kernels_avx512;

#endif
