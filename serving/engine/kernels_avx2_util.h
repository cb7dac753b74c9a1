/* kernels_avx2_util: what the AVX2 kernel files of the newer formats share (kernels_avx2_rows.c,
 * kernels_avx2_records.c). Internal; included inside their target("avx2,fma,f16c") region. */
#ifndef STRATA_KERNELS_AVX2_UTIL_H
#define STRATA_KERNELS_AVX2_UTIL_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define KERNEL_INLINE static inline __attribute__((always_inline))
/* Ahead on the row's stream (the integer work spreads the loads out, so the hardware prefetcher
 * alone runs behind; as matmul_simd.inc's Q4_K). */
#define PREFETCH(p) _mm_prefetch((const char *)(p) + 2048, _MM_HINT_T0)
/* Keep a running sum in a register: an empty asm the value passes through, so GCC cannot
 * reassociate a chain of adds into a tree over all its products and spill them (matmul_simd.inc's
 * Q4_0 records, docs/engine.md). No instruction is emitted. */
#define KEEP_IN_REG(v) __asm__("" : "+x"(v))

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

/* 32-bit lane k (0..3) of v in all 8 lanes (k need not be a constant: clang wants immediates
 * for vpshufd). */
static inline __m256i lane32(__m128i v, int k)
{
    return _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(v), _mm256_set1_epi32(k));
}

/* 8 f16 values (a record's 8 rows' scales) as floats. */
static inline __m256 f16x8(const void *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

#endif
