/* kernels_avx2: the kernels of matmul_simd.inc and fwd_simd.inc for AVX2 + FMA + F16C (x86-64-v3).
 * The target is set per function by the pragma, not by Makefile flags, so the rest of the program
 * stays baseline x86-64 and this file builds with any compiler flags (the fuzz build uses clang).
 */
#if defined(__x86_64__) /* the whole file: aarch64 has kernels_neon*.c */
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
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define KNAME(x) x##_avx2
#define ISA_NAME "avx2"
/* 16 ymm registers: 4 rows x 2 tokens of accumulators plus the operands. */
#define TILE_T 2
#define DOT_U8S8(acc, u, s)                                                                        \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1)))
#define MADD_I16(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#define DOT_TWO_MULS        /* a u8 x s8 dot is two multiplies: matmul_simd.inc saves them where it can */
#define X16_PREFETCH        1024 /* Q4_0/Q8_0 records: prefetch distance (matmul_simd.inc) */
#include "serving/engine/kernels_avx2_vf.h"

#include "serving/engine/matmul_simd.inc"
#include "serving/engine/fwd_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __x86_64__ */
