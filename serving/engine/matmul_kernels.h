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

/* Activations for Q8_0 weights (rows and 16-row groups) and Q4_0 groups: 32 values, x ~ d*qs,
 * exactly ggml's Q8_0 (d = amax/127 rounded to f16, qs = round(x * 127/amax)), plus -8*sum(qs),
 * the correction for Q4_0's offset of 8, and s: ggml's Q8_1 sum, d*sum(qs) with the unrounded d,
 * rounded to f16 (what Q4_1/Q5_1's minimum multiplies). */
struct act_q8 {
    float d;
    int32_t neg8sum;
    float s;
    int8_t qs[32];
};

/* Activations for the nibble formats in rows (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: ggml's Q8_0 or,
 * for Q4_1/Q5_1, Q8_1, whose sum comes from off), two blocks (b, b+1) per struct, in the order
 * the kernels consume them: one 256-bit integer dot product covers both blocks, lanes 0-3
 * summing block b and lanes 4-7 block b+1, so the float work (convert, scale, FMA) is done once
 * per pair, and a pair's activations are 4 loads. lo: elements 0..15 of b, then 0..15 of b+1
 * (they meet the weights' low nibbles); hi: elements 16..31 of each (high nibbles). off: -8 *
 * sum(qs) of b in lane 0 and of b+1 in lane 4, zero elsewhere (Q4_0's dot starts there; the
 * other formats derive their offset from it). d: the two scales, then zeros (the kernel loads
 * 4 floats); s: the two Q8_1 sums (act_q8.s), then zeros. An odd last block gets an all-zero
 * partner. Same values as act_q8 (act_q4_pack rearranges two of those). 128 bytes: every load
 * stays inside one cache line. */
struct act_q4 {
    int8_t lo[32];
    int8_t hi[32];
    int32_t off[8];
    float d[4];
    float s[4];
};

/* Activations for the super-block formats (K-quants, IQ4_XS): ggml's Q8_K exactly. 256 values,
 * x ~ d*qs with d = 1/iscale, iscale = -127/max (max: the value of largest magnitude, the first
 * if two tie), qs = min(127, round(iscale * x)); bsums: the sums of each 16 qs (for the mins of
 * Q2_K/Q4_K/Q5_K and the offsets of Q3_K/Q6_K). An all-zero block is all zero. */
struct act_q8k {
    float d;
    int16_t bsums[16];
    int8_t qs[256];
};

/* w: first row, ws: bytes between rows; x: first token (floats or act blocks), xs: bytes between
 * tokens; cols: elements per row; y: output of (row 0, token 0), ys: floats between tokens. */
typedef void (*tile_fn)(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs, int nt,
                        int cols, float *y, size_t ys);

/* KT_*_X16: the 16-row records of repack.h (w points at a group, nr is a multiple of 16, ws is
 * still the bytes of one source row). Activations: floats for F32/F16/BF16; act_q8 for Q8_0 and
 * the records of the blocks of 32; act_q4 for the nibble formats in rows; act_q8k for the
 * super-blocks, rows and records. */
enum {
    KT_F32,
    KT_F16,
    KT_BF16,
    KT_Q8_0,
    KT_Q4_0,
    KT_Q4_K,
    KT_Q8_0_X16,
    KT_Q4_0_X16,
    KT_Q4_1,
    KT_Q5_0,
    KT_Q5_1,
    KT_IQ4_NL,
    KT_Q2_K,
    KT_Q3_K,
    KT_Q5_K,
    KT_Q6_K,
    KT_IQ4_XS,
    KT_Q4_K_X16,
    KT_Q6_K_X16,
    KT_Q5_K_X16,
    KT_Q2_K_X16,
    KT_Q3_K_X16,
    KT_IQ4_XS_X16,
    KT_Q4_1_X16,
    KT_Q5_0_X16,
    KT_Q5_1_X16,
    KT_IQ4_NL_X16,
    KT_COUNT
};

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
extern const struct kernel_table kernels_avx2;    /* x86-64 only */
extern const struct kernel_table kernels_avxvnni; /* x86-64 only */
extern const struct kernel_table kernels_avx512;  /* x86-64 only */
extern const struct kernel_table kernels_neon;    /* aarch64 only */
extern const struct kernel_table kernels_dotprod; /* aarch64 only */
extern const struct kernel_table kernels_i8mm;    /* aarch64 only */

/* This architecture's tables, lowest first (kernels_scalar is [0]), kernel_tables_n of them:
 * what STRATA_ISA names and the tests walk. The CPU may lack the higher ones. */
extern const struct kernel_table *const kernel_tables[];
extern const int kernel_tables_n;

/* The AVX2 kernels of the formats added after the first six (kernels_avx2_rows.c) and of the
 * 16-row records but Q4_0's and Q8_0's (kernels_avx2_records.c): the AVX2, AVX-VNNI and AVX-512
 * tables all use them, but Q4_K's records, which the VNNI tables dot with vpdpbusd
 * (matmul_simd.inc). They take any nt up to 4. */
#define AVX2_MORE(name)                                                                            \
    void avx2_tile_##name(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,        \
                          int nt, int cols, float *y, size_t ys);
AVX2_MORE(q4_1)
AVX2_MORE(q5_0)
AVX2_MORE(q5_1)
AVX2_MORE(iq4_nl)
AVX2_MORE(q2_K)
AVX2_MORE(q3_K)
AVX2_MORE(q5_K)
AVX2_MORE(q6_K)
AVX2_MORE(iq4_xs)
AVX2_MORE(q4_K_x16)
AVX2_MORE(q6_K_x16)
AVX2_MORE(q5_K_x16)
AVX2_MORE(q2_K_x16)
AVX2_MORE(q3_K_x16)
AVX2_MORE(iq4_xs_x16)
AVX2_MORE(q4_1_x16)
AVX2_MORE(q5_0_x16)
AVX2_MORE(q5_1_x16)
AVX2_MORE(iq4_nl_x16)
#undef AVX2_MORE
/* Their entries in a kernel table's .tile (Q4_K's records apart: matmul_simd.inc). */
#define AVX2_MORE_TILES                                                                            \
    [KT_Q4_1] = avx2_tile_q4_1, [KT_Q5_0] = avx2_tile_q5_0, [KT_Q5_1] = avx2_tile_q5_1,            \
    [KT_IQ4_NL] = avx2_tile_iq4_nl, [KT_Q2_K] = avx2_tile_q2_K, [KT_Q3_K] = avx2_tile_q3_K,        \
    [KT_Q5_K] = avx2_tile_q5_K, [KT_Q6_K] = avx2_tile_q6_K, [KT_IQ4_XS] = avx2_tile_iq4_xs,        \
    [KT_Q6_K_X16] = avx2_tile_q6_K_x16, [KT_Q5_K_X16] = avx2_tile_q5_K_x16,                        \
    [KT_Q2_K_X16] = avx2_tile_q2_K_x16, [KT_Q3_K_X16] = avx2_tile_q3_K_x16,                        \
    [KT_IQ4_XS_X16] = avx2_tile_iq4_xs_x16, [KT_Q4_1_X16] = avx2_tile_q4_1_x16,                    \
    [KT_Q5_0_X16] = avx2_tile_q5_0_x16, [KT_Q5_1_X16] = avx2_tile_q5_1_x16,                        \
    [KT_IQ4_NL_X16] = avx2_tile_iq4_nl_x16

#endif
