/* kernels_avx2_vf: the 256-bit float primitives of matmul_simd.inc and fwd_simd.inc (see there)
 * and the formats the engine repacks as 16-row records, shared by the two tables that run on
 * 256-bit vectors: kernels_avx2.c and kernels_avxvnni.c. Internal; include inside a target region
 * with avx2, fma and f16c. */
#ifndef STRATA_KERNELS_AVX2_VF_H
#define STRATA_KERNELS_AVX2_VF_H

#define VF             __m256
#define VF_N           8
#define VF_TILE        2 /* query heads per key vector in attention's scores */
#define vf_zero()      _mm256_setzero_ps()
#define vf_load(p)     _mm256_loadu_ps(p)
#define vf_load_f16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define vf_load_bf16(p)                                                                            \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define vf_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define vf_hsum(v)      hsum_ps256(v)
#define vf_hmax(v)      hmax_ps256(v)
#define vf_set1(f)      _mm256_set1_ps(f)
#define vf_store(p, v)  _mm256_storeu_ps((p), (v))
#define vf_add(a, b)    _mm256_add_ps((a), (b))
#define vf_sub(a, b)    _mm256_sub_ps((a), (b))
#define vf_mul(a, b)    _mm256_mul_ps((a), (b))
#define vf_div(a, b)    _mm256_div_ps((a), (b))
#define vf_min(a, b)    _mm256_min_ps((a), (b))
#define vf_max(a, b)    _mm256_max_ps((a), (b))
#define vf_round(v)     _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vf_pow2i(n)                                                                                \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#define vf_zero_below(y, x, c) _mm256_and_ps((y), _mm256_cmp_ps((x), (c), _CMP_GE_OQ))
#define vf_store_f16(p, v)                                                                         \
    _mm_storeu_si128((__m128i *)(p),                                                               \
                     _mm256_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))

#define REPACK_TYPES                                                                               \
    (1u << GGML_Q4_0 | 1u << GGML_Q8_0 | 1u << GGML_Q4_K | 1u << GGML_Q6_K | 1u << GGML_Q5_K |     \
     1u << GGML_Q2_K | 1u << GGML_Q3_K | 1u << GGML_IQ4_XS | 1u << GGML_Q4_1 | 1u << GGML_Q5_0 |   \
     1u << GGML_Q5_1 | 1u << GGML_IQ4_NL)

#endif
