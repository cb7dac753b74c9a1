/* kernels_avx512: the kernels of matmul_simd.inc and fwd_simd.inc for AVX-512 F/BW/VL + VNNI
 * (Zen 4, Ice Lake and later): vpdpbusd/vpdpwssd for the integer dots, 512-bit FMA for float
 * weights and attention, and 32 vector registers for 4 x 4 tiles. Target set per function by the
 * pragma, as in kernels_avx2.c. */
#include "serving/engine/fwd_kernels.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"
#include "serving/engine/gguf.h"

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(                                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))),                 \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

#define KNAME(x)            x##_avx512
#define ISA_NAME            "avx512"
#define TILE_T              4
#define DOT_U8S8(acc, u, s) _mm256_dpbusd_epi32((acc), (u), (s))
#define MADD_I16(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#define VF                  __m512
#define VF_N                16
#define VF_TILE             4 /* query heads per key vector in attention's scores */
#define vf_zero()           _mm512_setzero_ps()
#define vf_load(p)          _mm512_loadu_ps(p)
#define vf_load_f16(p)      _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define vf_load_bf16(p)                                                                            \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define vf_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define vf_hsum(v)      _mm512_reduce_add_ps(v)
#define vf_hmax(v)      _mm512_reduce_max_ps(v)
#define vf_set1(f)      _mm512_set1_ps(f)
#define vf_store(p, v)  _mm512_storeu_ps((p), (v))
#define vf_add(a, b)    _mm512_add_ps((a), (b))
#define vf_sub(a, b)    _mm512_sub_ps((a), (b))
#define vf_mul(a, b)    _mm512_mul_ps((a), (b))
#define vf_div(a, b)    _mm512_div_ps((a), (b))
#define vf_min(a, b)    _mm512_min_ps((a), (b))
#define vf_max(a, b)    _mm512_max_ps((a), (b))
#define vf_round(v)     _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vf_pow2i(n)                                                                                \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define vf_zero_below(y, x, c) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), (c), _CMP_GE_OQ), (y))
#define vf_store_f16(p, v)                                                                         \
    _mm256_storeu_si256((__m256i *)(p),                                                            \
                        _mm512_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))

#define X16_Q8_DOT(acc, u, x) _mm256_dpbusd_epi32((acc), (u), (x))
#define X16_Q8_BIAS(neg8sum)  (16 * (neg8sum)) /* -128 * sum(x) */
#define REPACK_TYPES                                                                               \
    (1u << GGML_Q4_0 | 1u << GGML_Q8_0 | 1u << GGML_Q4_K | 1u << GGML_Q6_K | 1u << GGML_Q5_K |     \
     1u << GGML_Q2_K | 1u << GGML_Q3_K | 1u << GGML_IQ4_XS | 1u << GGML_Q4_1 | 1u << GGML_Q5_0 |   \
     1u << GGML_Q5_1 | 1u << GGML_IQ4_NL)

#include "serving/engine/matmul_simd.inc"
#include "serving/engine/fwd_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
