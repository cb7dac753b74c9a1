/* kernels_kq_x16: the steps every kernel of the Q4_K and Q5_K 16-row records (repack.h) shares,
 * whatever its dot instruction: the head's 6-bit scales and mins unpacked to row-ordered bytes,
 * and the record's end (the mins against x's per-32 sums, then the scalar kernel's float step
 * lane by lane, so results are the scalar kernel's bits). Used by kernels_avx2_records.c (AVX2)
 * and matmul_simd.inc (the VNNI tables). Internal; include inside a target region with avx2, fma
 * and f16c, after kernels_avx2_util.h. */
#ifndef STRATA_KERNELS_KQ_X16_H
#define STRATA_KERNELS_KQ_X16_H

#include "serving/engine/kernels_avx2_util.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/repack.h"

#include <immintrin.h>
#include <stdint.h>

/* [v_r, v_r] as 16-bit pairs for rows 8*half .. 8*half+7 of 16 row-ordered bytes. */
KERNEL_INLINE __m256i row_pairs_u8(__m128i v, int half)
{
    const __m128i dup =
        half ? _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
             : _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, dup));
}

/* n (even) six_bits_x16 fields of a record head as 16 row-ordered bytes each, less off (the
 * formats with signed scales store them + 32), two fields per 256-bit step: lane 0 field f,
 * lane 1 field f + 1. A field's 12
 * bytes: lo[8] (row r's low 4 bits in nibble r / 8 of lo[r % 8]), then hi[4] (its top 2 bits at
 * bit 2 (r / 4) of hi[r % 4]). The last load reads 8 bytes past the fields: every record has
 * its quants after them. */
KERNEL_INLINE void six_bits16_all(const struct six_bits_x16 *f, int n, int off, uint8_t out[][16])
{
    const __m256i voff = _mm256_set1_epi8((char)off);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
    /* dwords of the two fields: lo at 0-1 (f) and 3-4 (f + 1), hi at 2 and 5 */
    const __m256i plo = _mm256_setr_epi32(0, 1, 0, 1, 3, 4, 3, 4);
    const __m256i phi = _mm256_setr_epi32(2, 2, 2, 2, 5, 5, 5, 5);
    const __m256i shlo = _mm256_setr_epi64x(0, 4, 0, 4);
    const __m256i shhi = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
#pragma GCC unroll 8
    for (int k = 0; k < n / 2; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(f + 2 * k));
        const __m256i lo =
            _mm256_and_si256(_mm256_srlv_epi64(_mm256_permutevar8x32_epi32(v, plo), shlo), m4);
        const __m256i hi =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_permutevar8x32_epi32(v, phi), shhi), m3);
        const __m256i v6 = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), voff);
        /* two 16-byte stores: the kernels load a field at a time, and a load from the upper half
         * of a 32-byte store is not forwarded (Q3_K's first sub-blocks waited for it) */
        _mm_store_si128((__m128i *)out[2 * k], _mm256_castsi256_si128(v6));
        _mm_store_si128((__m128i *)out[2 * k + 1], _mm256_extracti128_si256(v6, 1));
    }
}

/* The float step every super-block record ends with, per 8 rows: the scalar kernel's
 * d * d_x * isum - dmin * d_x * msum, lane by lane (dmin and msum zero for the formats without
 * mins: X - 0 is X, as in the scalar kernel). */
KERNEL_INLINE __m256 kq_finish(__m256 acc, __m256 d, __m256 dmin, float dx, __m256i isum,
                               __m256i msum)
{
    const __m256 vdx = _mm256_set1_ps(dx);
    return _mm256_add_ps(
        acc, _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, vdx), _mm256_cvtepi32_ps(isum)),
                           _mm256_mul_ps(_mm256_mul_ps(dmin, vdx), _mm256_cvtepi32_ps(msum))));
}

/* A Q4_K/Q5_K record's end: the mins against x's per-32 sums, then the scalar kernel's
 * d * d_x * isum - dmin * d_x * msum lane by lane into accf (acc: the scaled integer sums of rows
 * 0-7 and 8-15 per token). */
KERNEL_INLINE void k45_finish(const struct block_q4_Kx16 *blk, uint8_t sm[][16], __m256i acc[2][2],
                              const uint8_t *x, size_t xs, int b, __m256 accf[2][2], const int NT)
{
    /* mins against the per-32 sums, sub-blocks in pairs: [m_2k, m_2k+1] per row */
    __m256i mp[2][4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m128i a = _mm_load_si128((const __m128i *)sm[8 + 2 * k]);
        const __m128i c = _mm_load_si128((const __m128i *)sm[9 + 2 * k]);
        mp[0][k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, c));
        mp[1][k] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, c));
    }
    const __m256 d0 = f16x8(blk->d);
    const __m256 d1 = f16x8(blk->d + 8);
    const __m256 m0 = f16x8(blk->dmin);
    const __m256 m1 = f16x8(blk->dmin + 8);
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
        /* [bs32_2k, bs32_2k+1] in 32-bit lane k */
        const __m128i b32 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a->bsums),
                                           _mm_loadu_si128((const __m128i *)(a->bsums + 8)));
        __m256i ms0 = _mm256_setzero_si256(), ms1 = ms0;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i bk = lane32(b32, k);
            ms0 = _mm256_add_epi32(ms0, _mm256_madd_epi16(mp[0][k], bk));
            ms1 = _mm256_add_epi32(ms1, _mm256_madd_epi16(mp[1][k], bk));
        }
        accf[0][t] = kq_finish(accf[0][t], d0, m0, a->d, acc[0][t], ms0);
        accf[1][t] = kq_finish(accf[1][t], d1, m1, a->d, acc[1][t], ms1);
    }
}

#endif
