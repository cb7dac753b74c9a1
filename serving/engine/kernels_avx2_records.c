/* kernels_avx2_records: AVX2 kernels of the 16-row records (repack.h) of every format beyond
 * Q4_0/Q8_0, which the engine stores for matrices whose row count is a multiple of 16: the
 * super-blocks against act_q8k, bit-identical to the scalar kernels, and the blocks of 32 against
 * act_q8. Used by the AVX2, AVX-VNNI and AVX-512 tables (see kernels_avx2_rows.c); a call takes
 * any nt up to 4, as tiles of 2 tokens. Target set per function by the pragma, as in kernels_avx2.c. */
#if defined(__x86_64__) /* the whole file: aarch64 has kernels_neon*.c */
#include "serving/engine/gguf.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "serving/engine/kernels_avx2_util.h"
#include "serving/engine/kernels_kq_x16.h"

/* ---- 16-row records (repack.h) of the super-block formats --------------------------------------
 * Each 32-byte load holds 4 quant bytes of 8 rows; one broadcast of the matching 4 activation
 * bytes meets all of them, and vpmaddwd with [s_r, s_r] per row (s_r: row r's sub-block scale)
 * scales while it adds, so an accumulator's 8 lanes are 8 rows' exact integer sums. The rows'
 * float arithmetic is then the scalar kernel's, lane by lane: bit-identical results. */

/* [bsums_2k, bsums_2k+1] of a in every 32-bit lane: one broadcast load. */
KERNEL_INLINE __m256i bsum_pair(const struct act_q8k *a, int k)
{
    int32_t v;
    memcpy(&v, a->bsums + 2 * k, 4);
    return _mm256_set1_epi32(v);
}

/* Q4_K and Q5_K records: per sub-block j, 4 chunks of 4 bytes per row, each byte elements
 * 32j + i (low nibble) and 32j + 16 + i (high), Q5_K's 5th bits or-ed in from its qh plane. All
 * products of a sub-block have the row's scale, so they add in 16 bits before one vpmaddwd:
 * Q4_K's 8 per row pair (at most 8 * 2 * 15 * 127 = 30480), Q5_K's 4 (4 * 2 * 31 * 127 = 31496,
 * so two vpmaddwd per sub-block). The head's 6-bit fields are unpacked once per record. */
KERNEL_INLINE void k45_x16_group(const int five, const uint8_t *w, const uint8_t *x, size_t xs,
                                 int nb, float *y, size_t ys, const int NT)
{
    /* Q4_K and Q5_K records share their head (d, dmin, sm); Q5_K's qh comes before its qs. */
    const size_t rec = five ? sizeof(struct block_q5_Kx16) : sizeof(struct block_q4_Kx16);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m128i dup0 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i dup1 = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const struct block_q4_Kx16 *blk = (const struct block_q4_Kx16 *)(w + (size_t)b * rec);
        const uint8_t *qs = five ? ((const struct block_q5_Kx16 *)blk)->qs : blk->qs;
        const uint8_t *qh = ((const struct block_q5_Kx16 *)blk)->qh;
        _Alignas(32) uint8_t sm[16][16];
        six_bits16_all(blk->sm, 16, 0, sm);
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            /* the next record, an eighth of it per sub-block (the integer work spreads the loads
             * out, so the hardware prefetcher alone runs behind; Q5_K has two streams) */
            const char *nx = (const char *)blk + rec + (rec / 8) * (size_t)j;
#pragma GCC unroll 5
            for (int l = 0; l < 5; l++) _mm_prefetch(nx + 64 * l, _MM_HINT_T0);
            if (five) _mm_prefetch(nx + 320, _MM_HINT_T0);
                /* rows 0-7 then rows 8-15: fewer values live at once (16 registers) */
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i hb =
                    five ? _mm256_loadu_si256((const __m256i *)(qh + 64 * j + 32 * hf)) : m4;
                __m256i p[2];
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const __m256i r =
                        _mm256_loadu_si256((const __m256i *)(qs + 64 * (4 * j + c) + 32 * hf));
                    __m256i l = _mm256_and_si256(r, m4);
                    __m256i h = _mm256_and_si256(_mm256_srli_epi16(r, 4), m4);
                    if (five) { /* bit 2c (2c + 1) of each qh byte to bit 4 */
                        const int sl = 4 - 2 * c, sh = 3 - 2 * c;
                        l = _mm256_or_si256(l,
                                            _mm256_and_si256(sl >= 0 ? _mm256_slli_epi16(hb, sl)
                                                                     : _mm256_srli_epi16(hb, -sl),
                                                             m16));
                        h = _mm256_or_si256(h,
                                            _mm256_and_si256(sh >= 0 ? _mm256_slli_epi16(hb, sh)
                                                                     : _mm256_srli_epi16(hb, -sh),
                                                             m16));
                    }
#pragma GCC unroll 2
                    for (int t = 0; t < NT; t++) {
                        const int8_t *xq =
                            ((const struct act_q8k *)(x + t * xs) + b)->qs + 32 * j + 4 * c;
                        const __m256i e =
                            _mm256_add_epi16(_mm256_maddubs_epi16(l, bcast4(xq)),
                                             _mm256_maddubs_epi16(h, bcast4(xq + 16)));
                        p[t] = (five ? c % 2 == 0 : c == 0) ? e : _mm256_add_epi16(p[t], e);
                        KEEP_IN_REG(p[t]); /* prefill64 768 x 768, best of 5: 100 -> 119 GFLOP/s */
                        if (five ? c % 2 == 1 : c == 3) {
                            /* [s_r, s_r] per row, made where used */
                            const __m128i sc = _mm_load_si128((const __m128i *)sm[j]);
                            const __m256i sp =
                                _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sc, hf ? dup1 : dup0));
                            acc[hf][t] = _mm256_add_epi32(acc[hf][t], _mm256_madd_epi16(p[t], sp));
                        }
                    }
                }
            }
        }
        k45_finish(blk, sm, acc, x, xs, b, accf, NT);
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

/* Q4_K alone: both halves of a chunk at once (rows 0-7 and 8-15 from one 64-byte pair of loads),
 * so each chunk's activations are broadcast once for the 16 rows and every running sum stays in
 * a register (k45_x16_group's halves made GCC keep the first half's broadcasts for the second,
 * spilled). The same integer sums as k45_x16_group(0, ...): the same bits. */
KERNEL_INLINE void q4_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const struct block_q4_Kx16 *blk = (const struct block_q4_Kx16 *)w + b;
        _Alignas(32) uint8_t sm[16][16];
        six_bits16_all(blk->sm, 16, 0, sm);
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const char *nx = (const char *)(blk + 1) + (sizeof *blk / 8) * (size_t)j;
#pragma GCC unroll 5
            for (int l = 0; l < 5; l++) _mm_prefetch(nx + 64 * l, _MM_HINT_T0);
            __m256i p0[2], p1[2];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const uint8_t *q = blk->qs + 64 * (4 * j + c);
                const __m256i r0 = _mm256_loadu_si256((const __m256i *)q);
                const __m256i r1 = _mm256_loadu_si256((const __m256i *)(q + 32));
                const __m256i l0 = _mm256_and_si256(r0, m4), l1 = _mm256_and_si256(r1, m4);
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), m4);
                const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), m4);
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq =
                        ((const struct act_q8k *)(x + t * xs) + b)->qs + 32 * j + 4 * c;
                    const __m256i xl = bcast4(xq), xh = bcast4(xq + 16);
                    const __m256i e0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                        _mm256_maddubs_epi16(h0, xh));
                    const __m256i e1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                        _mm256_maddubs_epi16(h1, xh));
                    p0[t] = c ? _mm256_add_epi16(p0[t], e0) : e0;
                    p1[t] = c ? _mm256_add_epi16(p1[t], e1) : e1;
                    KEEP_IN_REG(p0[t]);
                    KEEP_IN_REG(p1[t]);
                }
            }
            const __m128i sc = _mm_load_si128((const __m128i *)sm[j]);
            const __m256i s0 = row_pairs_u8(sc, 0), s1 = row_pairs_u8(sc, 1);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                acc[0][t] = _mm256_add_epi32(acc[0][t], _mm256_madd_epi16(p0[t], s0));
                acc[1][t] = _mm256_add_epi32(acc[1][t], _mm256_madd_epi16(p1[t], s1));
            }
        }
        k45_finish(blk, sm, acc, x, xs, b, accf, NT);
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

KERNEL_INLINE void q5_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    k45_x16_group(1, w, x, xs, nb, y, ys, NT);
}

/* nr rows = nr / 16 records per super-block column, tokens in tiles of 2. */
#define GROUP_TILE(name, GROUP, BLK)                                                               \
    void avx2_tile_##name(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,        \
                          int nt, int cols, float *y, size_t ys)                                   \
    {                                                                                              \
        for (int g = 0; g < nr; g += REPACK_ROWS)                                                  \
            for (int t = 0; t < nt; t += 2) {                                                      \
                if (nt - t >= 2)                                                                   \
                    GROUP(w + (size_t)g * ws, x + (size_t)t * xs, xs, cols / BLK, y + t * ys + g,  \
                          ys, 2);                                                                  \
                else                                                                               \
                    GROUP(w + (size_t)g * ws, x + (size_t)t * xs, xs, cols / BLK, y + t * ys + g,  \
                          ys, 1);                                                                  \
            }                                                                                      \
    }

GROUP_TILE(q4_K_x16, q4_K_x16_group, QK_K)
GROUP_TILE(q5_K_x16, q5_K_x16_group, QK_K)

/* Q6_K records: per sub-block of 16, three loads give the four 4-element groups (repack.h); the
 * two products of a pair of groups add in 16 bits (at most 4 * 63 * 127) before one vpmaddwd
 * with the rows' scales. The -32 offset comes once per record: 32 * sum_j scale_j * bsums_j. */
KERNEL_INLINE void q6_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    const struct block_q6_Kx16 *blk = (const struct block_q6_Kx16 *)w;
    const __m256i m63 = _mm256_set1_epi8(63), m3 = _mm256_set1_epi8(3);
    const __m256i m0c = _mm256_set1_epi8(0x0c), m30 = _mm256_set1_epi8(0x30);
    const __m128i dup0 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i dup1 = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++) {
            const __m128i sc = _mm_loadu_si128((const __m128i *)blk->scales[j]);
            const uint8_t *q = blk->q + 192 * j;
            _mm_prefetch((const char *)q + 3072, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 3136, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 3200, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, hf ? dup1 : dup0));
                const __m256i p0 = _mm256_loadu_si256((const __m256i *)(q + 32 * hf));
                const __m256i p1 = _mm256_loadu_si256((const __m256i *)(q + 64 + 32 * hf));
                const __m256i p2 = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * hf));
                const __m256i va = _mm256_and_si256(p0, m63), vb = _mm256_and_si256(p1, m63);
                const __m256i vc = _mm256_and_si256(p2, m63);
                const __m256i vd = _mm256_or_si256(
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p0, 6), m3),
                                    _mm256_and_si256(_mm256_srli_epi16(p1, 4), m0c)),
                    _mm256_and_si256(_mm256_srli_epi16(p2, 2), m30));
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq = ((const struct act_q8k *)(x + t * xs) + b)->qs + 16 * j;
                    const __m256i pab = _mm256_add_epi16(_mm256_maddubs_epi16(va, bcast4(xq)),
                                                         _mm256_maddubs_epi16(vb, bcast4(xq + 4)));
                    const __m256i pcd = _mm256_add_epi16(_mm256_maddubs_epi16(vc, bcast4(xq + 8)),
                                                         _mm256_maddubs_epi16(vd, bcast4(xq + 12)));
                    acc[hf][t] =
                        _mm256_add_epi32(acc[hf][t], _mm256_add_epi32(_mm256_madd_epi16(pab, s),
                                                                      _mm256_madd_epi16(pcd, s)));
                }
            }
        }
        /* the offsets: sum_j scale_j * bsums_j per row, sub-blocks in pairs */
        __m256i sp[2][8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m128i a = _mm_loadu_si128((const __m128i *)blk->scales[2 * k]);
            const __m128i c = _mm_loadu_si128((const __m128i *)blk->scales[2 * k + 1]);
            sp[0][k] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, c));
            sp[1][k] = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, c));
        }
        const __m256 d0 = f16x8(blk->d);
        const __m256 d1 = f16x8(blk->d + 8);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            __m256i o0 = _mm256_setzero_si256(), o1 = o0;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m256i bk = bsum_pair(a, k);
                o0 = _mm256_add_epi32(o0, _mm256_madd_epi16(sp[0][k], bk));
                o1 = _mm256_add_epi32(o1, _mm256_madd_epi16(sp[1][k], bk));
            }
            const __m256i i0 = _mm256_sub_epi32(acc[0][t], _mm256_slli_epi32(o0, 5));
            const __m256i i1 = _mm256_sub_epi32(acc[1][t], _mm256_slli_epi32(o1, 5));
            const __m256 dx = _mm256_set1_ps(a->d);
            /* the scalar kernel's d * d_x * isum (- 0) */
            accf[0][t] = _mm256_add_ps(
                accf[0][t], _mm256_mul_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(i0)));
            accf[1][t] = _mm256_add_ps(
                accf[1][t], _mm256_mul_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(i1)));
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

GROUP_TILE(q6_K_x16, q6_K_x16_group, QK_K)

/* [v_r, v_r] as signed 16-bit pairs for rows 8*half .. 8*half+7 of 16 row-ordered bytes. */
KERNEL_INLINE __m256i row_pairs_s8(__m128i v, int half)
{
    const __m128i dup =
        half ? _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
             : _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, dup));
}

/* sum_j v_j * bsums_j per row over 16 sub-blocks, v as 16 row-ordered bytes per sub-block
 * (signed or not), for the 8 rows of `half`: sub-blocks in pairs, [v_2k, v_2k+1] per row against
 * [bsums_2k, bsums_2k+1]. */
KERNEL_INLINE __m256i bsum_rows(const __m128i *v, int is_signed, const struct act_q8k *a, int half)
{
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m128i pr = half ? _mm_unpackhi_epi8(v[2 * k], v[2 * k + 1])
                                : _mm_unpacklo_epi8(v[2 * k], v[2 * k + 1]);
        const __m256i p16 = is_signed ? _mm256_cvtepi8_epi16(pr) : _mm256_cvtepu8_epi16(pr);
        const __m256i bk = bsum_pair(a, k);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, bk));
    }
    return s;
}

/* Q2_K records: per sub-block one chunk, its 4 groups of 4 at bits 2s; the four products add
 * in 16 bits (at most 8 * 3 * 127). */
KERNEL_INLINE void q2_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    const struct block_q2_Kx16 *blk = (const struct block_q2_Kx16 *)w;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
        __m128i mins[16];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 16; j++) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)blk->scales[j]);
            const __m128i sc = _mm_and_si128(raw, m4);
            mins[j] = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
            const uint8_t *q = blk->qs + 64 * j;
            _mm_prefetch((const char *)q + 1536, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i s = row_pairs_u8(sc, hf);
                const __m256i c = _mm256_loadu_si256((const __m256i *)(q + 32 * hf));
                const __m256i v0 = _mm256_and_si256(c, m3);
                const __m256i v1 = _mm256_and_si256(_mm256_srli_epi16(c, 2), m3);
                const __m256i v2 = _mm256_and_si256(_mm256_srli_epi16(c, 4), m3);
                const __m256i v3 = _mm256_and_si256(_mm256_srli_epi16(c, 6), m3);
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq = ((const struct act_q8k *)(x + t * xs) + b)->qs + 16 * j;
                    const __m256i p = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(v0, bcast4(xq)),
                                         _mm256_maddubs_epi16(v1, bcast4(xq + 4))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(v2, bcast4(xq + 8)),
                                         _mm256_maddubs_epi16(v3, bcast4(xq + 12))));
                    acc[hf][t] = _mm256_add_epi32(acc[hf][t], _mm256_madd_epi16(p, s));
                }
            }
        }
        const __m256 d0 = f16x8(blk->d);
        const __m256 d1 = f16x8(blk->d + 8);
        const __m256 m0 = f16x8(blk->dmin);
        const __m256 m1 = f16x8(blk->dmin + 8);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            accf[0][t] = kq_finish(accf[0][t], d0, m0, a->d, acc[0][t], bsum_rows(mins, 0, a, 0));
            accf[1][t] = kq_finish(accf[1][t], d1, m1, a->d, acc[1][t], bsum_rows(mins, 0, a, 1));
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

/* Q3_K records: per pair of sub-blocks three chunks give eight groups of 4 values 0..7 (repack.h);
 * four products add in 16 bits (at most 8 * 7 * 127) per sub-block; the -4 comes once per record,
 * 4 * sum_j scale_j * bsums_j. */
KERNEL_INLINE void q3_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    const struct block_q3_Kx16 *blk = (const struct block_q3_Kx16 *)w;
    const __m256i m7 = _mm256_set1_epi8(7), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    const __m256i m4 = _mm256_set1_epi8(4), m6 = _mm256_set1_epi8(6);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
        _Alignas(32) uint8_t sm[16][16];
        six_bits16_all(blk->sc, 16, 32, sm);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            const uint8_t *q = blk->q + 192 * k;
            _mm_prefetch((const char *)q + 1536, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 1600, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 1664, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i sa = row_pairs_s8(_mm_load_si128((const __m128i *)sm[2 * k]), hf),
                              sb = row_pairs_s8(_mm_load_si128((const __m128i *)sm[2 * k + 1]), hf);
                const __m256i p0 = _mm256_loadu_si256((const __m256i *)(q + 32 * hf));
                const __m256i p1 = _mm256_loadu_si256((const __m256i *)(q + 64 + 32 * hf));
                const __m256i p2 = _mm256_loadu_si256((const __m256i *)(q + 128 + 32 * hf));
                __m256i g[8];
                g[0] = _mm256_and_si256(p0, m7);
                g[1] = _mm256_and_si256(p1, m7);
                g[2] = _mm256_and_si256(p2, m7);
                g[3] = _mm256_and_si256(_mm256_srli_epi16(p0, 3), m7);
                g[4] = _mm256_and_si256(_mm256_srli_epi16(p1, 3), m7);
                g[5] = _mm256_and_si256(_mm256_srli_epi16(p2, 3), m7);
                g[6] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p0, 6), m3),
                                       _mm256_and_si256(_mm256_srli_epi16(p1, 4), m4));
                g[7] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p1, 7), m1),
                                       _mm256_and_si256(_mm256_srli_epi16(p2, 5), m6));
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq = ((const struct act_q8k *)(x + t * xs) + b)->qs + 32 * k;
                    const __m256i pa = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(g[0], bcast4(xq)),
                                         _mm256_maddubs_epi16(g[1], bcast4(xq + 4))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(g[2], bcast4(xq + 8)),
                                         _mm256_maddubs_epi16(g[3], bcast4(xq + 12))));
                    const __m256i pb = _mm256_add_epi16(
                        _mm256_add_epi16(_mm256_maddubs_epi16(g[4], bcast4(xq + 16)),
                                         _mm256_maddubs_epi16(g[5], bcast4(xq + 20))),
                        _mm256_add_epi16(_mm256_maddubs_epi16(g[6], bcast4(xq + 24)),
                                         _mm256_maddubs_epi16(g[7], bcast4(xq + 28))));
                    acc[hf][t] =
                        _mm256_add_epi32(acc[hf][t], _mm256_add_epi32(_mm256_madd_epi16(pa, sa),
                                                                      _mm256_madd_epi16(pb, sb)));
                }
            }
        }
        const __m256 d0 = f16x8(blk->d);
        const __m256 d1 = f16x8(blk->d + 8);
        const __m256 z = _mm256_setzero_ps();
        const __m256i zi = _mm256_setzero_si256();
        __m128i sv[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) sv[j] = _mm_load_si128((const __m128i *)sm[j]);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            const __m256i i0 =
                _mm256_sub_epi32(acc[0][t], _mm256_slli_epi32(bsum_rows(sv, 1, a, 0), 2));
            const __m256i i1 =
                _mm256_sub_epi32(acc[1][t], _mm256_slli_epi32(bsum_rows(sv, 1, a, 1), 2));
            accf[0][t] = kq_finish(accf[0][t], d0, z, a->d, i0, zi);
            accf[1][t] = kq_finish(accf[1][t], d1, z, a->d, i1, zi);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

/* IQ4_XS records: the levels by table lookup, |w| by a second lookup and x by w's sign, so the
 * products are |w| * +-x; each can reach 2 * 127 * 127, so each gets its own vpmaddwd. */
KERNEL_INLINE void iq4_xs_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                    size_t ys, const int NT)
{
    const struct block_iq4_xsx16 *blk = (const struct block_iq4_xsx16 *)w;
    const __m128i t128 = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    const __m256i tbl = _mm256_broadcastsi128_si256(t128);
    const __m256i tabs = _mm256_broadcastsi128_si256(_mm_abs_epi8(t128));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        _Alignas(32) uint8_t sm[8][16];
        six_bits16_all(blk->sc, 8, 32, sm);
        for (int j = 0; j < 8; j++) {
            const __m128i sc = _mm_load_si128((const __m128i *)sm[j]);
            const __m256i s0 = row_pairs_s8(sc, 0), s1 = row_pairs_s8(sc, 1);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const uint8_t *q = blk->qs + 64 * (4 * j + c);
                _mm_prefetch((const char *)q + 2048, _MM_HINT_T0);
#pragma GCC unroll 2
                for (int hf = 0; hf < 2; hf++) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 32 * hf));
                    const __m256i lo = _mm256_and_si256(raw, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                    const __m256i wl = _mm256_shuffle_epi8(tbl, lo),
                                  wh = _mm256_shuffle_epi8(tbl, hi);
                    const __m256i al = _mm256_shuffle_epi8(tabs, lo),
                                  ah = _mm256_shuffle_epi8(tabs, hi);
                    const __m256i s = hf ? s1 : s0;
#pragma GCC unroll 2
                    for (int t = 0; t < NT; t++) {
                        const int8_t *xq =
                            ((const struct act_q8k *)(x + t * xs) + b)->qs + 32 * j + 4 * c;
                        const __m256i pl =
                            _mm256_maddubs_epi16(al, _mm256_sign_epi8(bcast4(xq), wl));
                        const __m256i ph =
                            _mm256_maddubs_epi16(ah, _mm256_sign_epi8(bcast4(xq + 16), wh));
                        acc[hf][t] = _mm256_add_epi32(
                            acc[hf][t],
                            _mm256_add_epi32(_mm256_madd_epi16(pl, s), _mm256_madd_epi16(ph, s)));
                    }
                }
            }
        }
        const __m256 d0 = f16x8(blk->d);
        const __m256 d1 = f16x8(blk->d + 8);
        const __m256 z = _mm256_setzero_ps();
        const __m256i zi = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            accf[0][t] = kq_finish(accf[0][t], d0, z, a->d, acc[0][t], zi);
            accf[1][t] = kq_finish(accf[1][t], d1, z, a->d, acc[1][t], zi);
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

GROUP_TILE(q2_K_x16, q2_K_x16_group, QK_K)
GROUP_TILE(q3_K_x16, q3_K_x16_group, QK_K)
GROUP_TILE(iq4_xs_x16, iq4_xs_x16_group, QK_K)

/* ---- 16-row records of Q4_1, Q5_0, Q5_1, IQ4_NL against act_q8 ------------------------------
 * As matmul_simd.inc's Q4_0 groups: per block, 4 chunks of 4 bytes of 8 rows, the low nibbles
 * against elements 4k.., the high ones against 16 + 4k..; both products of a chunk add in 16
 * bits (at most 2 * 2 * 31 * 127) except IQ4_NL's (levels up to 127). The lanes' integer sums
 * are exact; per block they are scaled in floats (d_w * d_x, + m_w * s_x). */

enum { SB_Q4_1, SB_Q5_0, SB_Q5_1, SB_IQ4_NL };

KERNEL_INLINE void small_x16_group(const int kind, const uint8_t *w, const uint8_t *x, size_t xs,
                                   int nb, float *y, size_t ys, const int NT)
{
    const size_t rec = kind == SB_Q4_1 ? 320 : kind == SB_Q5_0 ? 352 : kind == SB_Q5_1 ? 384 : 288;
    const int om = 32, oqh = kind == SB_Q5_0 ? 32 : 64;
    const int oqs = kind == SB_Q4_1 ? 64 : kind == SB_Q5_0 ? 96 : kind == SB_Q5_1 ? 128 : 32;
    const int has_m = kind == SB_Q4_1 || kind == SB_Q5_1,
              has_h = kind == SB_Q5_0 || kind == SB_Q5_1;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128i t128 = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    const __m256i tbl = _mm256_broadcastsi128_si256(t128);
    const __m256i tabs = _mm256_broadcastsi128_si256(_mm_abs_epi8(t128));
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *r = w + (size_t)b * rec;
        _mm_prefetch((const char *)r + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)r + 2112, _MM_HINT_T0);
        _mm_prefetch((const char *)r + 2176, _MM_HINT_T0);
        _mm_prefetch((const char *)r + 2240, _MM_HINT_T0);
        __m256i hb[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        if (has_h) {
            hb[0] = _mm256_loadu_si256((const __m256i *)(r + oqh));
            hb[1] = _mm256_loadu_si256((const __m256i *)(r + oqh + 32));
        }
        __m256i is[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs) + b;
            /* Q5_0's q - 16: start from -16 * sum(x) = 2 * neg8sum */
            is[0][t] = is[1][t] = _mm256_set1_epi32(kind == SB_Q5_0 ? 2 * a->neg8sum : 0);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i raw =
                    _mm256_loadu_si256((const __m256i *)(r + oqs + 64 * k + 32 * hf));
                __m256i lo = _mm256_and_si256(raw, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                if (has_h) { /* bit 2k (2k + 1) of each byte to bit 4 */
                    const int sl = 4 - 2 * k, sh = 3 - 2 * k;
                    const __m256i h = hb[hf];
                    lo = _mm256_or_si256(lo, _mm256_and_si256(sl >= 0 ? _mm256_slli_epi16(h, sl)
                                                                      : _mm256_srli_epi16(h, -sl),
                                                              m16));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(sh >= 0 ? _mm256_slli_epi16(h, sh)
                                                                      : _mm256_srli_epi16(h, -sh),
                                                              m16));
                }
                __m256i wl = lo, wh = hi;
                if (kind == SB_IQ4_NL) {
                    wl = _mm256_shuffle_epi8(tbl, lo);
                    wh = _mm256_shuffle_epi8(tbl, hi);
                    lo = _mm256_shuffle_epi8(tabs, lo);
                    hi = _mm256_shuffle_epi8(tabs, hi);
                }
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq = ((const struct act_q8 *)(x + t * xs) + b)->qs + 4 * k;
                    __m256i xl = bcast4(xq), xh = bcast4(xq + 16);
                    if (kind == SB_IQ4_NL) {
                        xl = _mm256_sign_epi8(xl, wl);
                        xh = _mm256_sign_epi8(xh, wh);
                        is[hf][t] = _mm256_add_epi32(
                            is[hf][t], _mm256_add_epi32(
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), ones),
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), ones)));
                    } else
                        is[hf][t] = _mm256_add_epi32(
                            is[hf][t],
                            _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xl),
                                                               _mm256_maddubs_epi16(hi, xh)),
                                              ones));
                }
            }
        }
        const __m256 d0 = f16x8(r);
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16)));
        __m256 mw0 = _mm256_setzero_ps(), mw1 = mw0;
        if (has_m) {
            mw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + om)));
            mw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + om + 16)));
        }
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8 *a = (const struct act_q8 *)(x + t * xs) + b;
            const __m256 dx = _mm256_set1_ps(a->d);
            acc[0][t] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[0][t]), _mm256_mul_ps(d0, dx), acc[0][t]);
            acc[1][t] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[1][t]), _mm256_mul_ps(d1, dx), acc[1][t]);
            if (has_m) {
                const __m256 sx = _mm256_set1_ps(a->s);
                acc[0][t] = _mm256_fmadd_ps(mw0, sx, acc[0][t]);
                acc[1][t] = _mm256_fmadd_ps(mw1, sx, acc[1][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, acc[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, acc[1][t]);
    }
}

#define SMALL_GROUP(name, KIND)                                                                    \
    KERNEL_INLINE void name##_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb,     \
                                        float *y, size_t ys, const int NT)                         \
    {                                                                                              \
        small_x16_group(KIND, w, x, xs, nb, y, ys, NT);                                            \
    }
SMALL_GROUP(q4_1, SB_Q4_1)
SMALL_GROUP(q5_0, SB_Q5_0)
SMALL_GROUP(q5_1, SB_Q5_1)
SMALL_GROUP(iq4_nl, SB_IQ4_NL)
GROUP_TILE(q4_1_x16, q4_1_x16_group, 32)
GROUP_TILE(q5_0_x16, q5_0_x16_group, 32)
GROUP_TILE(q5_1_x16, q5_1_x16_group, 32)
GROUP_TILE(iq4_nl_x16, iq4_nl_x16_group, 32)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __x86_64__ */
