/* repack: quantized matrices rewritten in place into 16-row groups, the layout the SIMD kernels
 * read fastest: every quantized type has one (the blocks of 32 first, then the super-blocks).
 *
 * Q4_0 and Q8_0: in a group, each 32-column block of the 16 rows is one record: the 16 f16 scales, then the
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
 * matmul and tensor_get_row read it. Only tensors with rows % 16 == 0 are repacked. Each layout
 * is lossless: repack_block() gives back any row's ggml block. */
#ifndef STRATA_REPACK_H
#define STRATA_REPACK_H

#include "serving/engine/model.h"

#include <stddef.h>
#include <stdint.h>

#define REPACK_ROWS 16
/* A repacked tensor's type: 0x1000 | its ggml type. */
enum {
    TENSOR_Q4_0_X16 = 0x1002,
    TENSOR_Q4_1_X16 = 0x1003,
    TENSOR_Q5_0_X16 = 0x1006,
    TENSOR_Q5_1_X16 = 0x1007,
    TENSOR_IQ4_NL_X16 = 0x1014,
    TENSOR_Q8_0_X16 = 0x1008,
    TENSOR_Q4_K_X16 = 0x100c,
    TENSOR_Q2_K_X16 = 0x100a,
    TENSOR_Q3_K_X16 = 0x100b,
    TENSOR_Q5_K_X16 = 0x100d,
    TENSOR_Q6_K_X16 = 0x100e,
    TENSOR_IQ4_XS_X16 = 0x1017,
};

struct block_q4_0x16 {
    uint16_t d[16];
    uint8_t qs[256];
};
struct block_q8_0x16 {
    uint16_t d[16];
    uint8_t qs[512];
};

/* The other blocks of 32 like Q4_0 (nibbles in 4 chunks of 4 bytes per row, as ggml stores them
 * per row); Q4_1 and Q5_1 add the 16 mins, Q5_0 and Q5_1 the 5th bits as a plane of 4 bytes per
 * row: byte p holds in bit 2k the 5th bit of element 4k + p and in bit 2k + 1 that of element
 * 16 + 4k + p (k = 0..3, the chunks). */
struct block_q4_1x16 {
    uint16_t d[16], m[16];
    uint8_t qs[256];
};
struct block_q5_0x16 {
    uint16_t d[16];
    uint8_t qh[64];
    uint8_t qs[256];
};
struct block_q5_1x16 {
    uint16_t d[16], m[16];
    uint8_t qh[64];
    uint8_t qs[256];
};
struct block_iq4_nlx16 {
    uint16_t d[16];
    uint8_t qs[256];
};
_Static_assert(sizeof(struct block_q4_1x16) == 16 * 20 && sizeof(struct block_q5_0x16) == 16 * 22 &&
                   sizeof(struct block_q5_1x16) == 16 * 24 &&
                   sizeof(struct block_iq4_nlx16) == 16 * 18,
               "32-element record sizes");

/* Where quant byte i (0..31 for Q8_0, 0..15 for Q4_0) of row r (0..15) of a group sits within
 * its record's quants: chunk i / 4, rows 0-7 then 8-15, 4 bytes per row. */
static inline size_t repack_quant_at(int r, int i)
{
    return (size_t)64 * (i / 4) + 32 * (r / 8) + 4 * (r % 8) + i % 4;
}

/* ---- the super-block formats ---------------------------------------------------------------
 * One record per super-block of 256 columns of the 16 rows, the 16 rows' blocks rearranged (the
 * same bytes, so the same size): the f16 scales of the 16 rows side by side, the sub-block scales
 * transposed (per sub-block, the 16 rows'), and each quant plane of the ggml block 4 bytes per row
 * at a time as above (byte i of row r at repack_quant_at(r, i)), so one 32-byte load holds 4
 * bytes of 8 rows and a broadcast of the matching 4 activation bytes meets all of them: the 8
 * lanes of an integer accumulator are 8 rows' dots, scaled in the same vpmaddwd by a vector of
 * the 8 rows' sub-block scales, and the row kernel's per-sub-block shuffles and horizontal sums
 * disappear.
 *
 * 6-bit values of 16 rows (Q4_K's scales and mins): 12 bytes per field. lo[k] holds row k's low
 * 4 bits (low nibble) and row k+8's (high nibble); hi[k] holds the top 2 bits of rows k, k+4,
 * k+8, k+12 in bits 0-1, 2-3, 4-5, 6-7. */
struct six_bits_x16 {
    uint8_t lo[8];
    uint8_t hi[4];
};
/* Q4_K: fields 0-7 the sub-block scales, 8-15 the mins; qs per sub-block j, 16 bytes: byte i
 * holds element 32j + i (low nibble) and 32j + 16 + i (high), so both nibbles of a byte have
 * one scale (ggml pairs sub-blocks 2g and 2g+1 in a byte), a plane as above. */
struct block_q4_Kx16 {
    uint16_t d[16], dmin[16];
    struct six_bits_x16 sm[16];
    uint8_t qs[16 * 128];
};
_Static_assert(sizeof(struct block_q4_Kx16) == 16 * 144, "q4_K record size");

/* Q5_K: as Q4_K, the 5th bits in qh, 4 bytes per row per sub-block j (a plane): byte p holds in
 * bit 2c the 5th bit of element 32j + 4c + p and in bit 2c + 1 that of element 32j + 16 + 4c + p
 * (c = 0..3, the sub-block's 4 chunks of qs). */
struct block_q5_Kx16 {
    uint16_t d[16], dmin[16];
    struct six_bits_x16 sm[16];
    uint8_t qh[16 * 32];
    uint8_t qs[16 * 128];
};
_Static_assert(sizeof(struct block_q5_Kx16) == 16 * 176, "q5_K record size");

/* Q6_K: scales[j][r] is row r's sub-block j scale; per sub-block j (16 elements), 3 chunks of 4
 * bytes per row (a plane, chunk k of sub-block j at q + 64 * (3j + k)): byte p of chunk k holds
 * element 16j + 4k + p in its low 6 bits (k = 0, 1, 2), and bits 2k..2k+1 of element 16j + 12 + p
 * in its top 2: three vpand give three of the four 4-element groups, two shifts and ors more
 * the fourth (ggml's layout took 4 operations per 32 quants more). */
struct block_q6_Kx16 {
    uint16_t d[16];
    int8_t scales[16][16];
    uint8_t q[16 * 192];
};
_Static_assert(sizeof(struct block_q6_Kx16) == 16 * 210, "q6_K record size");

/* Q2_K: scales[j][r] is row r's byte for sub-block j (scale | min << 4, as ggml's); per
 * sub-block j, 4 bytes per row (a plane): byte p holds element 16j + 4s + p in bits 2s..2s+1. */
struct block_q2_Kx16 {
    uint16_t d[16], dmin[16];
    uint8_t scales[16][16];
    uint8_t qs[16 * 64];
};
_Static_assert(sizeof(struct block_q2_Kx16) == 16 * 84, "q2_K record size");

/* Q3_K: the 16 6-bit scales (the format subtracts 32); the 3-bit quants (0..7, the format
 * subtracts 4) of each 32 elements (sub-blocks 2k and 2k+1), as 8 groups of 4 (group g =
 * elements 32k + 4g .. + 3), in 3 chunks of 4 bytes per row (a plane, chunk i of pair k at
 * q + 64 * (3k + i)): byte p of chunk i holds group i's element p in bits 0-2, group i + 3's in
 * bits 3-5, and in bits 6-7: chunk 0 bits 0-1 of group 6's, chunk 1 bit 2 of group 6's and bit
 * 0 of group 7's, chunk 2 bits 1-2 of group 7's. */
struct block_q3_Kx16 {
    uint16_t d[16];
    struct six_bits_x16 sc[16];
    uint8_t q[16 * 96];
};
_Static_assert(sizeof(struct block_q3_Kx16) == 16 * 110, "q3_K record size");

/* IQ4_XS: the 8 6-bit scales (the format subtracts 32); qs as the ggml block's (per sub-block j,
 * byte i: elements 32j + i and 32j + 16 + i), a plane. */
struct block_iq4_xsx16 {
    uint16_t d[16];
    struct six_bits_x16 sc[8];
    uint8_t qs[16 * 128];
};
_Static_assert(sizeof(struct block_iq4_xsx16) == 16 * 136, "iq4_xs record size");

void six_bits_put(struct six_bits_x16 *f, int r, int v);
int six_bits_get(const struct six_bits_x16 *f, int r);

/* The repacked type of a type that has one, else 0; and back (the ggml type a layout holds). */
uint32_t repack_type_of(uint32_t ggml_type);
uint32_t repack_base_type(uint32_t type);
/* The name of any tensor type: ggml_type_name() for GGUF types, "q8_0x16", "q4_kx16", ... for
 * repacked ones. */
const char *tensor_type_name(uint32_t type);
/* 1 if t can be repacked: a type with a layout above, rows a multiple of 16. */
int repack_eligible(const struct tensor *t);
/* Rewrite t's bytes in place (t->data must be writable) and set its type. Fails only if the
 * 16-row staging buffer cannot be allocated. */
int repack_tensor(struct tensor *t, char *err);
/* The same with its groups split over a thread pool's threads (NULL: the calling thread). */
struct threadpool;
int repack_tensor_tp(struct tensor *t, struct threadpool *tp, char *err);
/* Row r's ggml block out of one record of a repacked type (at most 512 bytes). */
void repack_unpack(uint32_t type, const void *record, int r, void *block);
/* Block b of row `row` of a repacked tensor, as the ggml block it came from (at most 512 bytes). */
void repack_block(const struct tensor *t, int row, int b, void *block);
/* Row `row` of a repacked tensor, dequantized (what dequantize_row gives for the source row). */
void repack_dequantize_row(const struct tensor *t, int row, float *out);

#endif
