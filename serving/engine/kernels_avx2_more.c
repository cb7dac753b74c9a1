/* kernels_avx2_more: AVX2 kernels of the weight formats beyond the first six (quant.h): the
 * nibble formats in rows against act_q4 (Q4_1, Q5_0, Q5_1, IQ4_NL) and the super-blocks against
 * act_q8k (Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS). The AVX2 and the AVX-512 tables both use them (an
 * AVX-512 variant would be this file compiled with vpdpbusd; none was written, as no AVX-512
 * machine was at hand to test one), so a call takes any nt up to 4, run as tiles of 2 tokens.
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

#define KERNEL_INLINE static inline __attribute__((always_inline))
/* Ahead on the row's stream (the integer work spreads the loads out, so the hardware prefetcher
 * alone runs behind; as matmul_simd.inc's Q4_K). */
#define PREFETCH(p) _mm_prefetch((const char *)(p) + 2048, _MM_HINT_T0)

static inline int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Signed x signed bytes, pairs summed to i16: |w| * (x with w's sign). |w| <= 127, so a pair
 * stays within i16. */
KERNEL_INLINE __m256i dot_s8s8(__m256i w, __m256i x)
{
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* [s[2k] x8 | s[2k+1] x8] from a vector holding the same 8 16-bit scales in both halves. */
KERNEL_INLINE __m256i scale_pair(__m256i s, int k)
{
    const __m256i shuf = _mm256_setr_epi8(
        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1), (char)(4 * k),
        (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1),
        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1), (char)(4 * k),
        (char)(4 * k + 1), (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2),
        (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2),
        (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2),
        (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2),
        (char)(4 * k + 3));
    return _mm256_shuffle_epi8(s, shuf);
}

/* The tile: each row against the tokens in tiles of 2 (ROW takes its token count as a constant,
 * so the loops over tokens unroll and the accumulators stay in registers). */
#define TILE(name, ROW)                                                                            \
    void avx2_tile_##name(const uint8_t *w, size_t ws, int nr, const uint8_t *x, size_t xs,        \
                          int nt, int cols, float *y, size_t ys)                                   \
    {                                                                                              \
        for (int r = 0; r < nr; r++)                                                               \
            for (int t = 0; t < nt; t += 2) {                                                      \
                if (nt - t >= 2)                                                                   \
                    ROW(w + (size_t)r * ws, x + (size_t)t * xs, xs, cols, y + t * ys + r, ys, 2);  \
                else                                                                               \
                    ROW(w + (size_t)r * ws, x + (size_t)t * xs, xs, cols, y + t * ys + r, ys, 1);  \
            }                                                                                      \
    }

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
        const __m256i sh = _mm256_permute4x64_epi64(sc16, h ? 0xee : 0x44);
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
        const __m256i sh = _mm256_permute4x64_epi64(sc16, h ? 0xee : 0x44);
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
        const __m256i sh = _mm256_permute4x64_epi64(sc16, h ? 0xee : 0x44);
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

/* ---- 16-row records (repack.h) of the super-block formats --------------------------------------
 * Each 32-byte load holds 4 quant bytes of 8 rows; one broadcast of the matching 4 activation
 * bytes meets all of them, and vpmaddwd with [s_r, s_r] per row (s_r: row r's sub-block scale)
 * scales while it adds, so an accumulator's 8 lanes are 8 rows' exact integer sums. The rows'
 * float arithmetic is then the scalar kernel's, lane by lane: bit-identical results. */

/* The 16 rows' 6-bit values of one field (repack.h's six_bits_x16) as bytes in row order. */
KERNEL_INLINE __m128i six_bits16(const struct six_bits_x16 *f)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i lo8 = _mm_loadl_epi64((const __m128i *)f->lo);
    const __m128i lo =
        _mm_unpacklo_epi64(_mm_and_si128(lo8, m4), _mm_and_si128(_mm_srli_epi16(lo8, 4), m4));
    uint32_t h;
    memcpy(&h, f->hi, 4);
    __m128i hi = _mm_srlv_epi32(_mm_set1_epi32((int)h), _mm_setr_epi32(0, 2, 4, 6));
    hi = _mm_slli_epi16(_mm_and_si128(hi, _mm_set1_epi8(3)), 4);
    return _mm_or_si128(lo, hi);
}

/* [v_r, v_r] as 16-bit pairs for rows 8*half .. 8*half+7 of 16 row-ordered bytes. */
KERNEL_INLINE __m256i row_pairs_u8(__m128i v, int half)
{
    const __m128i dup =
        half ? _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
             : _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, dup));
}

static inline __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Q4_K and Q5_K records: per sub-block j, 4 chunks of 4 bytes per row, each byte elements
 * 32j + i (low nibble) and 32j + 16 + i (high), Q5_K's 5th bits or-ed in from its qh plane: both
 * products have the row's scale, so they are added in 16 bits (at most 2 * 2 * 31 * 127)
 * before one vpmaddwd. */
KERNEL_INLINE void k45_x16_group(const int five, const uint8_t *w, const uint8_t *x, size_t xs,
                                 int nb, float *y, size_t ys, const int NT)
{
    /* Q4_K and Q5_K records share their head (d, dmin, sm); Q5_K's qh comes before its qs. */
    const size_t rec = five ? sizeof(struct block_q5_Kx16) : sizeof(struct block_q4_Kx16);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const struct block_q4_Kx16 *blk = (const struct block_q4_Kx16 *)(w + (size_t)b * rec);
        const uint8_t *qs = five ? ((const struct block_q5_Kx16 *)blk)->qs : blk->qs;
        const uint8_t *qh = ((const struct block_q5_Kx16 *)blk)->qh;
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m128i sc = six_bits16(&blk->sm[j]);
            const __m256i s0 = row_pairs_u8(sc, 0), s1 = row_pairs_u8(sc, 1);
            __m256i hb0 = _mm256_setzero_si256(), hb1 = hb0;
            if (five) {
                hb0 = _mm256_loadu_si256((const __m256i *)(qh + 64 * j));
                hb1 = _mm256_loadu_si256((const __m256i *)(qh + 64 * j + 32));
            }
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const uint8_t *q = qs + 64 * (4 * j + c);
                _mm_prefetch((const char *)q + 2048, _MM_HINT_T0);
                const __m256i r0 = _mm256_loadu_si256((const __m256i *)q);
                const __m256i r1 = _mm256_loadu_si256((const __m256i *)(q + 32));
                __m256i l0 = _mm256_and_si256(r0, m4), l1 = _mm256_and_si256(r1, m4);
                __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), m4);
                __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), m4);
                if (five) { /* bit 2c (2c + 1) of each qh byte to bit 4 */
                    const int sl = 4 - 2 * c, sh = 3 - 2 * c;
                    l0 = _mm256_or_si256(l0, _mm256_and_si256(sl >= 0 ? _mm256_slli_epi16(hb0, sl)
                                                                      : _mm256_srli_epi16(hb0, -sl),
                                                              m16));
                    l1 = _mm256_or_si256(l1, _mm256_and_si256(sl >= 0 ? _mm256_slli_epi16(hb1, sl)
                                                                      : _mm256_srli_epi16(hb1, -sl),
                                                              m16));
                    h0 = _mm256_or_si256(h0, _mm256_and_si256(sh >= 0 ? _mm256_slli_epi16(hb0, sh)
                                                                      : _mm256_srli_epi16(hb0, -sh),
                                                              m16));
                    h1 = _mm256_or_si256(h1, _mm256_and_si256(sh >= 0 ? _mm256_slli_epi16(hb1, sh)
                                                                      : _mm256_srli_epi16(hb1, -sh),
                                                              m16));
                }
#pragma GCC unroll 2
                for (int t = 0; t < NT; t++) {
                    const int8_t *xq =
                        ((const struct act_q8k *)(x + t * xs) + b)->qs + 32 * j + 4 * c;
                    const __m256i xl = bcast4(xq), xh = bcast4(xq + 16);
                    acc[0][t] = _mm256_add_epi32(
                        acc[0][t], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(l0, xl),
                                                                      _mm256_maddubs_epi16(h0, xh)),
                                                     s0));
                    acc[1][t] = _mm256_add_epi32(
                        acc[1][t], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(l1, xl),
                                                                      _mm256_maddubs_epi16(h1, xh)),
                                                     s1));
                }
            }
        }
        /* mins against the per-32 sums, sub-blocks in pairs: [m_2k, m_2k+1] per row */
        __m256i mp[2][4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m128i a = six_bits16(&blk->sm[8 + 2 * k]), c = six_bits16(&blk->sm[9 + 2 * k]);
            mp[0][k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, c));
            mp[1][k] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, c));
        }
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));
        const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->dmin));
        const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->dmin + 8)));
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            /* [bs32_2k, bs32_2k+1] in 32-bit lane k */
            const __m128i b32 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)a->bsums),
                                               _mm_loadu_si128((const __m128i *)(a->bsums + 8)));
            __m256i ms0 = _mm256_setzero_si256(), ms1 = ms0;
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i bk = _mm256_broadcastd_epi32(_mm_shuffle_epi32(b32, 0x55 * k));
                ms0 = _mm256_add_epi32(ms0, _mm256_madd_epi16(mp[0][k], bk));
                ms1 = _mm256_add_epi32(ms1, _mm256_madd_epi16(mp[1][k], bk));
            }
            /* the scalar kernel's d * d_x * isum - dmin * d_x * msum, lane by lane */
            const __m256 dx = _mm256_set1_ps(a->d);
            accf[0][t] = _mm256_add_ps(
                accf[0][t],
                _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d0, dx), _mm256_cvtepi32_ps(acc[0][t])),
                              _mm256_mul_ps(_mm256_mul_ps(m0, dx), _mm256_cvtepi32_ps(ms0))));
            accf[1][t] = _mm256_add_ps(
                accf[1][t],
                _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d1, dx), _mm256_cvtepi32_ps(acc[1][t])),
                              _mm256_mul_ps(_mm256_mul_ps(m1, dx), _mm256_cvtepi32_ps(ms1))));
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(y + t * ys, accf[0][t]);
        _mm256_storeu_ps(y + t * ys + 8, accf[1][t]);
    }
}

KERNEL_INLINE void q4_K_x16_group(const uint8_t *w, const uint8_t *x, size_t xs, int nb, float *y,
                                  size_t ys, const int NT)
{
    k45_x16_group(0, w, x, xs, nb, y, ys, NT);
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
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            const struct act_q8k *a = (const struct act_q8k *)(x + t * xs) + b;
            const __m128i bl = _mm_loadu_si128((const __m128i *)a->bsums);
            const __m128i bh = _mm_loadu_si128((const __m128i *)(a->bsums + 8));
            __m256i o0 = _mm256_setzero_si256(), o1 = o0;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m256i bk =
                    _mm256_broadcastd_epi32(_mm_shuffle_epi32(k < 4 ? bl : bh, 0x55 * (k % 4)));
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

/* sum_j v_j * bsums_j per row over 16 sub-blocks, v as 16 row-ordered bytes per sub-block
 * (signed or not), for the 8 rows of `half`: sub-blocks in pairs, [v_2k, v_2k+1] per row against
 * [bsums_2k, bsums_2k+1]. */
KERNEL_INLINE __m256i bsum_rows(const __m128i *v, int is_signed, const struct act_q8k *a, int half)
{
    const __m128i bl = _mm_loadu_si128((const __m128i *)a->bsums);
    const __m128i bh = _mm_loadu_si128((const __m128i *)(a->bsums + 8));
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m128i pr = half ? _mm_unpackhi_epi8(v[2 * k], v[2 * k + 1])
                                : _mm_unpacklo_epi8(v[2 * k], v[2 * k + 1]);
        const __m256i p16 = is_signed ? _mm256_cvtepi8_epi16(pr) : _mm256_cvtepu8_epi16(pr);
        const __m256i bk =
            _mm256_broadcastd_epi32(_mm_shuffle_epi32(k < 4 ? bl : bh, 0x55 * (k % 4)));
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
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));
        const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->dmin));
        const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->dmin + 8)));
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
    const __m128i k32 = _mm_set1_epi8(32);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
        __m128i sv[16];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            sv[2 * k] = _mm_sub_epi8(six_bits16(&blk->sc[2 * k]), k32);
            sv[2 * k + 1] = _mm_sub_epi8(six_bits16(&blk->sc[2 * k + 1]), k32);
            const uint8_t *q = blk->q + 192 * k;
            _mm_prefetch((const char *)q + 1536, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 1600, _MM_HINT_T0);
            _mm_prefetch((const char *)q + 1664, _MM_HINT_T0);
#pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                const __m256i sa = row_pairs_s8(sv[2 * k], hf),
                              sb = row_pairs_s8(sv[2 * k + 1], hf);
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
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));
        const __m256 z = _mm256_setzero_ps();
        const __m256i zi = _mm256_setzero_si256();
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
    const __m128i k32 = _mm_set1_epi8(32);
    __m256 accf[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) accf[0][t] = accf[1][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, blk++) {
        __m256i acc[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) acc[0][t] = acc[1][t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m128i sc = _mm_sub_epi8(six_bits16(&blk->sc[j]), k32);
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
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk->d));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk->d + 8)));
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
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)r));
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
