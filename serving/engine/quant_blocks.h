/* quant_blocks: the per-format (de)quantizers behind quant.h's quantize_row/dequantize_row.
 * Internal to quant*.c. Each takes nb blocks (of 32 or of 256 elements, as the format has). */
#ifndef STRATA_QUANT_BLOCKS_H
#define STRATA_QUANT_BLOCKS_H

#include "serving/engine/quant.h"

#include <stdint.h>
#include <string.h>

/* ggml's nearest_int: round to nearest, ties to even, for |v| < 2^22. Adding 1.5*2^23 puts the
 * integer in the low mantissa bits (the float addition does the rounding). */
static inline int quant_nearest_int(float v)
{
    float t = v + 12582912.f;
    uint32_t i;
    memcpy(&i, &t, sizeof i);
    return (int)(i & 0x007fffff) - 0x00400000;
}

/* quant_kquants.c */
void quantize_q2_K(const float *x, struct block_q2_K *y, int nb);
void quantize_q3_K(const float *x, struct block_q3_K *y, int nb);
void quantize_q4_K(const float *x, struct block_q4_K *y, int nb);
void quantize_q5_K(const float *x, struct block_q5_K *y, int nb);
void quantize_q6_K(const float *x, struct block_q6_K *y, int nb);
void dequantize_q2_K(const struct block_q2_K *b, float *y, int nb);
void dequantize_q3_K(const struct block_q3_K *b, float *y, int nb);
void dequantize_q4_K(const struct block_q4_K *b, float *y, int nb);
void dequantize_q5_K(const struct block_q5_K *b, float *y, int nb);
void dequantize_q6_K(const struct block_q6_K *b, float *y, int nb);

/* quant_iq4.c */
void quantize_iq4_nl(const float *x, struct block_iq4_nl *y, int nb);
void quantize_iq4_xs(const float *x, struct block_iq4_xs *y, int nb);
void dequantize_iq4_nl(const struct block_iq4_nl *b, float *y, int nb);
void dequantize_iq4_xs(const struct block_iq4_xs *b, float *y, int nb);

#endif
