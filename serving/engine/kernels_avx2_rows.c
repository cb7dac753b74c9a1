/* kernels_avx2_rows: AVX2 kernels of the formats beyond the first six (quant.h) in ggml's row
 * layout: the nibble formats against act_q4 (Q4_1, Q5_0, Q5_1, IQ4_NL) and the super-blocks
 * against act_q8k (Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS). The engine stores matrices whose row count is
 * a multiple of 16 as records (kernels_avx2_records.c); these serve the others and tensors a
 * source keeps in the file's layout. The AVX2, AVX-VNNI and AVX-512 tables all use them (a VNNI
 * variant would be this file with vpdpbusd; none was written yet), so a call takes any nt up to 4,
 * run as tiles of 2 tokens.
 *
 * Shape (as matmul_simd.inc): one row at a time, a sequential stream through memory; every token
 * of a tile runs the same code whatever the tile's size, so its result does not depend on the
 * batch. The super-block kernels compute each super-block's integer sums exactly and then do
 * the scalar kernel's float arithmetic (d * d_x * isum - dmin * d_x * msum), so they are
 * bit-identical to the scalar kernels. Offsets (Q3_K's -4, Q6_K's -32) are not applied per
 * element: the quants are multiplied as unsigned values and the offset times the activations'
 * per-16 sums (act_q8k.bsums) is subtracted once per super-block. Scales per 16 elements are
 * applied with one vpmaddwd per 32 quants: vpmaddubsw leaves sub-block 2k's products in the low
 * 128 bits and 2k+1's in the high, so a vector of [scale_2k x8 | scale_2k+1 x8] (one vpshufb of
 * the super-block's 16-bit scales) weights both. Target set per function by the pragma, as in
 * kernels_avx2.c. */
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

/* ---- nibble formats in rows: Q4_1, Q5_0, Q5_1, IQ4_NL against act_q4 -------------------------
 * As matmul_simd.inc's Q4_0: two blocks per step, the low nibbles of both in one vector and the
 * high nibbles in another, matching act_q4's lo/hi; lanes 0-3 sum block b, 4-7 block b+1, and
 * one convert and FMA with [s_b x4, s_b+1 x4] finish both. */

enum { NB_Q4_1, NB_Q5_0, NB_Q5_1, NB_IQ4_NL };

/* Bytes per block, and where the scale, min, high bits and nibbles sit in it. */
#define NB_BYTES(k) ((k) == NB_Q4_1 ? 20 : (k) == NB_Q5_0 ? 22 : (k) == NB_Q5_1 ? 24 : 18)
#define NB_QS(k)    ((k) == NB_Q4_1 ? 4 : (k) == NB_Q5_0 ? 6 : (k) == NB_Q5_1 ? 8 : 2)
#define NB_QH(k)    ((k) == NB_Q5_0 ? 2 : 4)

/* The 5th bits of blocks b and b+1 as 0x10 in the bytes of the lo (which = 0) or hi (1) vector:
 * byte i of each half takes bit i (+16 for hi) of its block's qh. */
KERNEL_INLINE __m256i q5_high_bits(uint64_t qh2, int which)
{
    const __m256i sel = which ? _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 6,
                                                 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)
                              : _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 4,
                                                 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)qh2), sel);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

KERNEL_INLINE void nibble_pair(const int kind, const uint8_t *blk, const int two, const uint8_t *xa,
                               size_t xs, __m256 *acc, __m128 *accm, const int NT)
{
    const int bb = NB_BYTES(kind);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + NB_QS(kind)));
    __m256i raw =
        two ? _mm256_inserti128_si256(_mm256_castsi128_si256(q0),
                                      _mm_loadu_si128((const __m128i *)(blk + bb + NB_QS(kind))), 1)
            : _mm256_zextsi128_si256(q0);
    __m256i lo = _mm256_and_si256(raw, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if (kind == NB_Q5_0 || kind == NB_Q5_1) {
        uint32_t h0, h1 = 0;
        memcpy(&h0, blk + NB_QH(kind), 4);
        if (two) memcpy(&h1, blk + bb + NB_QH(kind), 4);
        uint64_t qh2 = h0 | (uint64_t)h1 << 32;
        lo = _mm256_or_si256(lo, q5_high_bits(qh2, 0));
        hi = _mm256_or_si256(hi, q5_high_bits(qh2, 1));
    }
    if (kind == NB_IQ4_NL) {
        const __m256i tbl =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        lo = _mm256_shuffle_epi8(tbl, lo);
        hi = _mm256_shuffle_epi8(tbl, hi);
    }
    uint16_t d0, d1 = 0, m0 = 0, m1 = 0;
    memcpy(&d0, blk, 2);
    if (two) memcpy(&d1, blk + bb, 2);
    __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d0 | (uint32_t)d1 << 16)));
    __m128 mw = _mm_setzero_ps();
    if (kind == NB_Q4_1 || kind == NB_Q5_1) {
        memcpy(&m0, blk + 2, 2);
        if (two) memcpy(&m1, blk + bb + 2, 2);
        mw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)m0 | (uint32_t)m1 << 16)));
    }
    const __m256i halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        const struct act_q4 *a = (const struct act_q4 *)(xa + t * xs);
        const __m256i xl = _mm256_loadu_si256((const __m256i *)a->lo);
        const __m256i xh = _mm256_loadu_si256((const __m256i *)a->hi);
        __m256i pl, ph;
        if (kind == NB_IQ4_NL) {
            pl = dot_s8s8(lo, xl);
            ph = dot_s8s8(hi, xh);
        } else {
            pl = _mm256_maddubs_epi16(lo, xl);
            ph = _mm256_maddubs_epi16(hi, xh);
        }
        /* the two halves' 16-bit sums may add in 16 bits unless the levels reach 127 */
        __m256i p = kind == NB_IQ4_NL
                        ? _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones))
                        : _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones);
        if (kind == NB_Q5_0) /* q - 16: start from -16 * sum(x) = 2 * off */
            p = _mm256_add_epi32(p,
                                 _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)a->off), 1));
        __m128 dx = _mm_loadu_ps(a->d);
        __m128 s = _mm_mul_ps(dw, dx);
        __m256 sc = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), halves);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[t]);
        if (kind == NB_Q4_1 || kind == NB_Q5_1) /* + m * s_x (ggml's Q8_1 sum) */
            accm[t] = _mm_fmadd_ps(mw, _mm_loadu_ps(a->s), accm[t]);
    }
}

KERNEL_INLINE void nibble_row(const int kind, const uint8_t *w, const uint8_t *x, size_t xs,
                              int cols, float *y, size_t ys, const int NT)
{
    const int nb = cols / 32, bb = NB_BYTES(kind);
    __m256 acc0[2], acc1[2];
    __m128 accm[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        acc0[t] = acc1[t] = _mm256_setzero_ps();
        accm[t] = _mm_setzero_ps();
    }
    int b = 0;
    for (; b + 4 <= nb; b += 4, x += 2 * sizeof(struct act_q4)) {
        PREFETCH(w + (size_t)b * bb);
        PREFETCH(w + (size_t)b * bb + 64);
        nibble_pair(kind, w + (size_t)b * bb, 1, x, xs, acc0, accm, NT);
        nibble_pair(kind, w + (size_t)(b + 2) * bb, 1, x + sizeof(struct act_q4), xs, acc1, accm,
                    NT);
    }
    for (; b < nb; b += 2, x += sizeof(struct act_q4))
        nibble_pair(kind, w + (size_t)b * bb, nb - b >= 2, x, xs, acc0, accm, NT);
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        __m128 m = accm[t];
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));
        y[t * ys] = hsum_ps(_mm256_add_ps(acc0[t], acc1[t])) + _mm_cvtss_f32(m);
    }
}

#define q4_1_row(...)   nibble_row(NB_Q4_1, __VA_ARGS__)
#define q5_0_row(...)   nibble_row(NB_Q5_0, __VA_ARGS__)
#define q5_1_row(...)   nibble_row(NB_Q5_1, __VA_ARGS__)
#define iq4_nl_row(...) nibble_row(NB_IQ4_NL, __VA_ARGS__)
TILE(q4_1, q4_1_row)
TILE(q5_0, q5_0_row)
TILE(q5_1, q5_1_row)
TILE(iq4_nl, iq4_nl_row)

/* ---- super-blocks against act_q8k ------------------------------------------------------------
 * Each kernel's block function adds, per token, the super-block's scaled integer dots into
 * isum[t] (an 8-lane vector) and returns through msum[t] what the scalar kernel subtracts with
 * dmin (or 0); the row loop finishes each super-block as the scalar kernel does. */

#define ACT(t) ((const struct act_q8k *)(x + (t)*xs) + b)

/* sum over 16 sub-blocks of scale_j * bsums_j (scales as 16 x i16). */
KERNEL_INLINE int bsum_dot(const struct act_q8k *a, __m256i sc16)
{
    return hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), sc16));
}

/* Q2_K: q (2 bits) of element 128h + 32s + l in bits 2s of qs[32h + l]; sub-blocks of 16. */
KERNEL_INLINE void q2_K_block(const struct block_q2_K *blk, const uint8_t *x, size_t xs, int b,
                              int *isum, int *msum, const int NT)
{
    const __m128i raw = _mm_loadu_si128((const __m128i *)blk->scales);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * h));
        const __m256i sh =
            (h ? _mm256_permute4x64_epi64(sc16, 0xee) : _mm256_permute4x64_epi64(sc16, 0x44));
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            const __m256i v = _mm256_and_si256(s ? _mm256_srli_epi16(q, 2 * s) : q, m3);
            const __m256i scv = scale_pair(sh, s);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                const __m256i xq =
                    _mm256_loadu_si256((const __m256i *)(ACT(t)->qs + 128 * h + 32 * s));
                acc[t] =
                    _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v, xq), scv));
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        isum[t] = hsum_i32(acc[t]);
        msum[t] = bsum_dot(ACT(t), mn16);
    }
}

/* Q3_K: q = 2 low bits as Q2_K | bit (e / 32) of hmask[e % 32] << 2, 0..7 (minus 4); 6-bit
 * scales minus 32. */
KERNEL_INLINE void q3_K_block(const struct block_q3_K *blk, const uint8_t *x, size_t xs, int b,
                              int *isum, int *msum, const int NT)
{
    /* The 16 6-bit scales as bytes, 4 at a time (quant.h's layout), then - 32. */
    uint32_t a0, a1, a2, sc[4];
    memcpy(&a0, blk->scales, 4);
    memcpy(&a1, blk->scales + 4, 4);
    memcpy(&a2, blk->scales + 8, 4);
    sc[0] = (a0 & 0x0f0f0f0f) | ((a2 & 0x03030303) << 4);
    sc[1] = (a1 & 0x0f0f0f0f) | (((a2 >> 2) & 0x03030303) << 4);
    sc[2] = ((a0 >> 4) & 0x0f0f0f0f) | (((a2 >> 4) & 0x03030303) << 4);
    sc[3] = ((a1 >> 4) & 0x0f0f0f0f) | (((a2 >> 6) & 0x03030303) << 4);
    const __m128i sc8 = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)sc), _mm_set1_epi8(32));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)blk->hmask);
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * h));
        const __m256i sh =
            (h ? _mm256_permute4x64_epi64(sc16, 0xee) : _mm256_permute4x64_epi64(sc16, 0x44));
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            const int k = 4 * h + s; /* hmask bit */
            __m256i hb = _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << k)));
            hb = k >= 2 ? _mm256_srli_epi16(hb, k - 2) : _mm256_slli_epi16(hb, 2 - k);
            const __m256i v =
                _mm256_or_si256(_mm256_and_si256(s ? _mm256_srli_epi16(q, 2 * s) : q, m3), hb);
            const __m256i scv = scale_pair(sh, s);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                const __m256i xq =
                    _mm256_loadu_si256((const __m256i *)(ACT(t)->qs + 128 * h + 32 * s));
                acc[t] =
                    _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(v, xq), scv));
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        isum[t] = hsum_i32(acc[t]) - 4 * bsum_dot(ACT(t), sc16);
        msum[t] = 0;
    }
}

/* Q5_K: as matmul_simd.inc's Q4_K, with the 5th bit of group g's low / high elements in bit
 * 2g / 2g+1 of qh[l]. */
KERNEL_INLINE void q5_K_block(const struct block_q5_K *blk, const uint8_t *x, size_t xs, int b,
                              int *isum, int *msum, const int NT)
{
    uint32_t u[4], s0, s1, s2;
    memcpy(&s0, blk->scales, 4);
    memcpy(&s1, blk->scales + 4, 4);
    memcpy(&s2, blk->scales + 8, 4);
    u[0] = s0 & 0x3f3f3f3f;                                            /* sc 0-3 */
    u[1] = (s2 & 0x0f0f0f0f) | (((s0 >> 6) & 0x03030303) << 4);        /* sc 4-7 */
    u[2] = s1 & 0x3f3f3f3f;                                            /* min 0-3 */
    u[3] = ((s2 >> 4) & 0x0f0f0f0f) | (((s1 >> 6) & 0x03030303) << 4); /* min 4-7 */
    const uint8_t *sc = (const uint8_t *)u;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256((const __m256i *)blk->qh);
    __m256i acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * g));
        /* bit 2g (2g+1) of each qh byte to bit 4 */
        const int sl = 4 - 2 * g, sh = 3 - 2 * g;
        __m256i hl = sl >= 0 ? _mm256_slli_epi16(qh, sl) : _mm256_srli_epi16(qh, -sl);
        __m256i hh = sh >= 0 ? _mm256_slli_epi16(qh, sh) : _mm256_srli_epi16(qh, -sh);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(hl, m16));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                           _mm256_and_si256(hh, m16));
        const __m256i slo = _mm256_set1_epi16(sc[2 * g]), shi = _mm256_set1_epi16(sc[2 * g + 1]);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(ACT(t)->qs + 64 * g));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(ACT(t)->qs + 64 * g + 32));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), slo));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), shi));
        }
    }
    /* mins against the per-32 sums: bsums pairs added (hadd), then 8 x 16-bit products */
    const __m128i mins = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&u[2]));
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)ACT(t)->bsums);
        const __m128i b32 =
            _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        __m128i mm = _mm_madd_epi16(b32, mins);
        mm = _mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0x4e));
        mm = _mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0xb1));
        isum[t] = hsum_i32(acc[t]);
        msum[t] = _mm_cvtsi128_si32(mm);
    }
}

/* Q6_K: q (0..63, minus 32) = 4 bits from ql, 2 from qh (quant.h); int8 scales per 16. */
KERNEL_INLINE void q6_K_block(const struct block_q6_K *blk, const uint8_t *x, size_t xs, int b,
                              int *isum, int *msum, const int NT)
{
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256i acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i q0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h));
        const __m256i q1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h));
        const __m256i sh =
            (h ? _mm256_permute4x64_epi64(sc16, 0xee) : _mm256_permute4x64_epi64(sc16, 0x44));
        __m256i v[4];
        v[0] = _mm256_or_si256(_mm256_and_si256(q0, m4),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
        v[1] = _mm256_or_si256(_mm256_and_si256(q1, m4),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
        v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4),
                               _mm256_and_si256(qh, m30));
        v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            const __m256i scv = scale_pair(sh, s);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                const __m256i xq =
                    _mm256_loadu_si256((const __m256i *)(ACT(t)->qs + 128 * h + 32 * s));
                acc[t] = _mm256_add_epi32(acc[t],
                                          _mm256_madd_epi16(_mm256_maddubs_epi16(v[s], xq), scv));
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        isum[t] = hsum_i32(acc[t]) - 32 * bsum_dot(ACT(t), sc16);
        msum[t] = 0;
    }
}

/* IQ4_XS: sub-block pair p (64 elements) is 32 bytes of nibbles: the low nibbles are elements
 * 0-15 of sub-blocks 2p and 2p+1, the high ones 16-31; the activations are gathered to match. */
KERNEL_INLINE void iq4_xs_block(const struct block_iq4_xs *blk, const uint8_t *x, size_t xs, int b,
                                int *isum, int *msum, const int NT)
{
    /* 6-bit scales - 32 as 8 x i16, in both halves: low 4 bits from scales_l's nibbles, top 2
     * from scales_h. */
    uint32_t sl;
    memcpy(&sl, blk->scales_l, 4);
    const __m128i m4x = _mm_set1_epi8(0x0f);
    __m128i l4 = _mm_cvtsi32_si128((int)sl);
    l4 = _mm_unpacklo_epi8(_mm_and_si128(l4, m4x), _mm_and_si128(_mm_srli_epi16(l4, 4), m4x));
    __m128i h2 = _mm_srlv_epi32(_mm_set1_epi32(blk->scales_h), _mm_setr_epi32(0, 2, 4, 6));
    __m128i h2b = _mm_srlv_epi32(_mm_set1_epi32(blk->scales_h), _mm_setr_epi32(8, 10, 12, 14));
    h2 = _mm_packus_epi32(_mm_and_si128(h2, _mm_set1_epi32(3)),
                          _mm_and_si128(h2b, _mm_set1_epi32(3)));
    const __m128i ls = _mm_sub_epi16(_mm_or_si128(_mm_cvtepu8_epi16(l4), _mm_slli_epi16(h2, 4)),
                                     _mm_set1_epi16(32));
    const __m256i ls2 = _mm256_broadcastsi128_si256(ls);
    const __m256i tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i acc[2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * p));
        const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(raw, m4));
        const __m256i hi =
            _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
        const __m256i scv = scale_pair(ls2, p);
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const int8_t *xq = ACT(t)->qs + 64 * p;
            const __m256i xl = _mm256_loadu2_m128i((const __m128i *)(xq + 32), (const __m128i *)xq);
            const __m256i xh =
                _mm256_loadu2_m128i((const __m128i *)(xq + 48), (const __m128i *)(xq + 16));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(dot_s8s8(lo, xl), scv));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(dot_s8s8(hi, xh), scv));
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        isum[t] = hsum_i32(acc[t]);
        msum[t] = 0;
    }
}

/* The row: super-blocks in order, each finished in floats as the scalar kernel does. DMIN: the
 * super-block's dmin (0 for the formats without mins). */
#define KQUANT_ROW(name, BLK, DMIN)                                                                \
    KERNEL_INLINE void name##_row(const uint8_t *w, const uint8_t *x, size_t xs, int cols,         \
                                  float *y, size_t ys, const int NT)                               \
    {                                                                                              \
        const struct BLK *blk = (const struct BLK *)w;                                             \
        float sum[2] = {0, 0};                                                                     \
        for (int b = 0; b < cols / QK_K; b++, blk++) {                                             \
            PREFETCH(blk);                                                                         \
            PREFETCH((const uint8_t *)blk + 64);                                                   \
            PREFETCH((const uint8_t *)blk + 128);                                                  \
            int isum[2], msum[2];                                                                  \
            name##_block(blk, x, xs, b, isum, msum, NT);                                           \
            const float d = matmul_f16_table[blk->d], dmin = DMIN;                                 \
            _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) sum[t] +=                         \
                d * ACT(t)->d * (float)isum[t] - dmin * ACT(t)->d * (float)msum[t];                \
        }                                                                                          \
        _Pragma("GCC unroll 2") for (int t = 0; t < NT; t++) y[t * ys] = sum[t];                   \
    }

KQUANT_ROW(q2_K, block_q2_K, matmul_f16_table[blk->dmin])
KQUANT_ROW(q5_K, block_q5_K, matmul_f16_table[blk->dmin])
KQUANT_ROW(q3_K, block_q3_K, 0.0f)
KQUANT_ROW(q6_K, block_q6_K, 0.0f)
KQUANT_ROW(iq4_xs, block_iq4_xs, 0.0f)

TILE(q2_K, q2_K_row)
TILE(q3_K, q3_K_row)
TILE(q5_K, q5_K_row)
TILE(q6_K, q6_K_row)
TILE(iq4_xs, iq4_xs_row)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __x86_64__ */
