/* repack: Q4_0 and Q8_0 matrices rewritten in place into 16-row groups, the layout the SIMD
 * kernels read fastest.
 *
 * In a group, each 32-column block of the 16 rows is one record: the 16 f16 scales, then the
 * quants in 64-byte chunks. Chunk k holds, for rows 0-7 then rows 8-15, 4 consecutive quant
 * bytes of each row (bytes 4k..4k+3 of the ggml block), so one 32-byte load has 4 bytes of 8
 * rows and one broadcast of 4 activation bytes multiplies all of them (vpdpbusd leaves the 8
 * rows' partial sums in the 8 lanes). Q4_0 records are 288 bytes (4 chunks of packed nibbles, as
 * ggml stores them); Q8_0 records are 544 bytes (8 chunks, each quant stored +128, unsigned,
 * which vpdpbusd's unsigned operand wants; the kernels subtract 128*sum(x)). A group is 16 rows'
 * bytes, the same size as the source, so the tensor keeps its place in the weight image.
 *
 * Why: a GEMV over ggml's row layout spends more instructions per block than memory delivers
 * bytes for (Q4_0: nibbles of 2 blocks to spread, a scale per block), and one core could not
 * keep up with DRAM; in groups, the scales of 16 rows convert in two instructions and every
 * weight load feeds a dot product directly (docs/engine.md has the figures).
 *
 * Rows stop being contiguous, so a repacked tensor carries its own type (TENSOR_*_X16) and only
 * matmul and tensor_get_row read it. Only tensors with rows % 16 == 0 are repacked. */
#ifndef STRATA_REPACK_H
#define STRATA_REPACK_H

#include "serving/engine/model.h"

#include <stddef.h>
#include <stdint.h>

#define REPACK_ROWS 16
enum { TENSOR_Q4_0_X16 = 0x1002, TENSOR_Q8_0_X16 = 0x1008 };

struct block_q4_0x16 {
    uint16_t d[16];
    uint8_t qs[256];
};
struct block_q8_0x16 {
    uint16_t d[16];
    uint8_t qs[512];
};

/* Where quant byte i (0..31 for Q8_0, 0..15 for Q4_0) of row r (0..15) of a group sits within
 * its record's quants: chunk i / 4, rows 0-7 then 8-15, 4 bytes per row. */
static inline size_t repack_quant_at(int r, int i)
{
    return (size_t)64 * (i / 4) + 32 * (r / 8) + 4 * (r % 8) + i % 4;
}

/* The repacked type of a Q4_0/Q8_0 type, else 0; and back (the ggml type a layout holds). */
uint32_t repack_type_of(uint32_t ggml_type);
uint32_t repack_base_type(uint32_t type);
/* The name of any tensor type: ggml_type_name() for GGUF types, "q8_0x16"/"q4_0x16" for repacked.
 */
const char *tensor_type_name(uint32_t type);
/* 1 if t can be repacked: Q4_0 or Q8_0 with rows a multiple of 16. */
int repack_eligible(const struct tensor *t);
/* Rewrite t's bytes in place (t->data must be writable) and set its type. Fails only if the
 * 16-row staging buffer cannot be allocated. */
int repack_tensor(struct tensor *t, char *err);
/* Row `row` of a repacked tensor, dequantized (what dequantize_row gives for the source row). */
void repack_dequantize_row(const struct tensor *t, int row, float *out);

#endif
