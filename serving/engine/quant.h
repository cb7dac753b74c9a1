/* quant: the weight formats, bit-exact with ggml (ggml-common.h's blocks, ggml-quants.c's
 * formulas), and their (de)quantizers.
 *
 * The structs below are the on-disk blocks, byte for byte (no padding; f16 fields are the raw
 * IEEE half bits), so they can be shared with the CUDA kernels. In every format an element is
 * x = d * q (symmetric) or x = d * q + m (with a minimum); "sub-block j" is elements 32j..32j+31
 * (16j..16j+15 for the 16-element sub-blocks of Q2_K, Q3_K and Q6_K).
 *
 * Blocks of 32 (one scale each):
 *   Q8_0   x = d*q, q int8.
 *   Q4_0   x = d*(q-8), q the nibbles: byte j holds element j (low) and j+16 (high).
 *   Q4_1   x = d*q + m, nibbles as Q4_0.
 *   Q5_0   x = d*(q-16), q = nibble (as Q4_0) | bit j of qh (little-endian u32) << 4 for element j.
 *   Q5_1   x = d*q + m, q as Q5_0.
 *   IQ4_NL x = d*kvalues_iq4nl[nibble], nibbles as Q4_0 (a non-linear 16-entry grid).
 * Super-blocks of 256:
 *   Q2_K   x = d*sc*q - dmin*m over 16 sub-blocks of 16: scales[j] = sc (low 4 bits) | m << 4;
 *          q 2 bits: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l].
 *   Q3_K   x = d*(sc-32)*(q-4) over 16 sub-blocks of 16, sc 6 bits (12 bytes: low nibbles of
 *          sub-blocks 0-7 in bytes 0-7 low, 8-15 in bytes 0-7 high, top 2 bits of sub-block j in
 *          bits 2(j/4).. of byte 8 + j%4); q = 2 low bits as Q2_K | bit (j/32) of hmask[j%32] << 2.
 *   Q4_K   x = d*sc*q - dmin*m over 8 sub-blocks of 32, sc and m 6 bits (q4_K_scale_min());
 *          qs holds 4 groups of 64: byte l of group g has element 64g+l (low), 64g+32+l (high).
 *   Q5_K   as Q4_K, q = nibble | bit (2g or 2g+1) of qh[l] << 4.
 *   Q6_K   x = d*sc*(q-32) over 16 sub-blocks of 16, sc int8; q = 4 bits from ql, 2 from qh:
 *          for half h (128 elements), element 128h + 32s + l: ql[64h + l + 32(s&1)] nibble s/2,
 *          qh[32h + l] bits 2s..2s+1.
 *   IQ4_XS x = d*(ls-32)*kvalues_iq4nl[nibble] over 8 sub-blocks of 32, ls 6 bits: low 4 in
 *          scales_l (nibble j%2 of byte j/2), top 2 in bits 2j.. of scales_h; nibbles as Q4_0
 *          per sub-block (16 bytes each).
 * F32; F16 (IEEE half); BF16 (upper half of an f32, round-to-nearest-even on conversion).
 *
 * quantize_row() writes what llama.cpp's llama-quantize writes from the same floats without an
 * importance matrix, byte for byte, for every type here (tests/unit/test_quant_files.c checks
 * it against ../shared/models/quant-refs): ggml's reference quantizers (quantize_row_*_ref) for
 * Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants, and its quantize_iq4_nl/iq4_xs (ntry 7). */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define QK8_0 32
#define QK4_0 32
#define QK_K  256

struct block_q8_0 {
    uint16_t d; /* f16 */
    int8_t qs[QK8_0];
};
struct block_q4_0 {
    uint16_t d; /* f16 */
    uint8_t qs[QK4_0 / 2];
};
struct block_q4_1 {
    uint16_t d, m; /* f16 */
    uint8_t qs[16];
};
struct block_q5_0 {
    uint16_t d;    /* f16 */
    uint8_t qh[4]; /* bit j: the 5th bit of element j */
    uint8_t qs[16];
};
struct block_q5_1 {
    uint16_t d, m; /* f16 */
    uint8_t qh[4];
    uint8_t qs[16];
};
struct block_iq4_nl {
    uint16_t d; /* f16 */
    uint8_t qs[16];
};
struct block_q2_K {
    uint8_t scales[QK_K / 16]; /* sc | m << 4 per sub-block of 16 */
    uint8_t qs[QK_K / 4];
    uint16_t d, dmin; /* f16 */
};
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d; /* f16 */
};
struct block_q4_K {
    uint16_t d, dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};
struct block_q5_K {
    uint16_t d, dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d; /* f16 */
};
struct block_iq4_xs {
    uint16_t d; /* f16 */
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};

_Static_assert(sizeof(struct block_q4_1) == 20 && sizeof(struct block_q5_0) == 22 &&
                   sizeof(struct block_q5_1) == 24 && sizeof(struct block_iq4_nl) == 18,
               "32-element block sizes");
_Static_assert(sizeof(struct block_q2_K) == 84 && sizeof(struct block_q3_K) == 110 &&
                   sizeof(struct block_q4_K) == 144 && sizeof(struct block_q5_K) == 176 &&
                   sizeof(struct block_q6_K) == 210 && sizeof(struct block_iq4_xs) == 136,
               "super-block sizes");

/* IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl). */
extern const int8_t kvalues_iq4nl[16];

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* 1 if the type is one of the above (quantize_row, dequantize_row and matmul take it). */
int quant_type_supported(uint32_t type);
/* Their names, for messages: "f32, f16, bf16, q8_0, ...". */
const char *quant_type_list(void);

/* n must be a multiple of the type's block size. Return -1 for unsupported types. */
int quantize_row(uint32_t type, const float *x, void *out, int n);
int dequantize_row(uint32_t type, const void *in, float *out, int n);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block's 12 scale bytes. */
void q4_K_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);
/* The 6-bit scale (0..63, the format subtracts 32) of sub-block j (0..15) of a Q3_K super-block. */
int q3_K_scale(int j, const uint8_t *scales);
/* The 6-bit scale (0..63, the format subtracts 32) of sub-block j (0..7) of an IQ4_XS block. */
int iq4_xs_scale(int j, const struct block_iq4_xs *b);

#endif
