/* quant: the weight formats, bit-exact with ggml.
 *
 * F32; F16 (IEEE half); BF16 (upper half of an f32, round-to-nearest-even on conversion);
 * Q8_0: blocks of 32, one f16 scale d and 32 int8 q, x = d*q;
 * Q4_0: blocks of 32, one f16 scale d and 16 bytes of nibbles (low nibbles are elements 0..15,
 *       high nibbles 16..31), x = d*(q-8);
 * Q4_K: super-blocks of 256 with 8 sub-blocks of 32, 6-bit scales and mins, f16 d and dmin.
 * quantize_row() produces what ggml's reference quantizers produce for the same input. */
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
struct block_q4_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[QK_K / 2];
};

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);

/* n must be a multiple of the type's block size. Return -1 for unsupported types. */
int quantize_row(uint32_t type, const float *x, void *out, int n);
int dequantize_row(uint32_t type, const void *in, float *out, int n);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block's 12 scale bytes. */
void q4_K_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);

#endif
