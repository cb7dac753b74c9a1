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

/* Activations for Q4_0 weights, two blocks (b, b+1) per struct, in the order the Q4_0 kernel
 * consumes them: one 256-bit integer dot product covers both blocks, lanes 0-3 summing block b
 * and lanes 4-7 block b+1, so the float work (convert, scale, FMA) is done once per pair, and a
 * pair's activations are 4 loads. lo: elements 0..15 of b, then 0..15 of b+1 (they meet the
 * weights' low nibbles); hi: elements 16..31 of each (high nibbles). off: the dot's starting
 * value, -8*sum(qs) of b in lane 0 and of b+1 in lane 4, zero elsewhere. d: the two scales, then
 * zeros (the kernel loads 4 floats). An odd last block gets an all-zero partner. Same values as
 * act_q8 (act_q4_pack rearranges two of those). */
struct act_q4 {
    int8_t lo[32];
    int8_t hi[32];
    int32_t off[8];
    float d[4];
    uint8_t pad[16]; /* 128 bytes: every load stays inside one cache line */
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

/* KT_*_X16: the 16-row groups of repack.h (w points at a group, nr is a multiple of 16, ws is
 * still the bytes of one source row; activations are act_q8 for both). */
enum { KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_K, KT_Q8_0_X16, KT_Q4_0_X16, KT_COUNT };

struct kernel_table {
    const char *name;
    int tile_t; /* tokens per tile (registers permitting) */
    tile_fn tile[KT_COUNT];
    /* Activation quantizers; every table's give bit-identical results (same formulas). */
    void (*quant_q8)(const float *x, struct act_q8 *a, int nb);
    void (*quant_q8k)(const float *x, struct act_q8k *a, int nb);
    void (*quant_q4)(const float *x, struct act_q4 *a, int nb); /* nb blocks, (nb + 1) / 2 out */
    /* Bit (1 << ggml type) set: this table is faster on that type repacked (repack.h). Every
     * table computes every layout; this only says which one to store. */
    unsigned repack_types;
};

/* f16 -> f32 for every half: the kernels convert one scale per block, and a table load
 * (broadcast straight from memory) is cheaper than vcvtph2ps on a scalar. Filled by
 * matmul_init. */
extern float matmul_f16_table[1 << 16];

void quantize_act_q8(const float *x, struct act_q8 *a, int nb);
void quantize_act_q8k(const float *x, struct act_q8k *a, int nb);
void quantize_act_q4(const float *x, struct act_q4 *a, int nb);
/* Rearrange blocks q[0] and q[1] (q[1] all zero for an odd last block) into one act_q4. */
void act_q4_pack(const struct act_q8 q[2], struct act_q4 *a);

extern const struct kernel_table kernels_scalar;
extern const struct kernel_table kernels_avx2;
extern const struct kernel_table kernels_avx512;

#endif
