/* kernels_avxvnni: the kernels of matmul_simd.inc for AVX2 + AVX-VNNI (the VEX-encoded vpdpbusd
 * and vpdpwssd of Intel's Alder Lake and later cores, the AVX-512-less Xeon 6 E-core parts among
 * them, and of AMD Zen 5). The AVX2 table's shape (16 ymm registers, 2 tokens per call) with
 * the AVX-512 table's integer dots: one vpdpbusd where AVX2 needs vpmaddubsw + vpmaddwd + vpaddd,
 * so the records' u8 x s8 dots take matmul_simd.inc's VNNI branches (Q8_0's +128 storage dotted
 * as is, with a start of -128 * sum(x)). The float kernels and fwd_simd.inc are the AVX2 table's
 * (fwd_kernels_for maps "avxvnni" to them); so are the kernels of the formats in
 * kernels_avx2_rows.c and kernels_avx2_records.c, as for the AVX-512 table. Target set per
 * function by the pragma, as in kernels_avx2.c. */
#if defined(__x86_64__) /* the whole file: aarch64 has kernels_neon*.c */
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
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define KNAME(x)              x##_avxvnni
#define ISA_NAME              "avxvnni"
#define TILE_T                2 /* 16 ymm registers, as kernels_avx2.c */
#define DOT_U8S8(acc, u, s)   _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define MADD_I16(acc, p, s)   _mm256_dpwssd_avx_epi32((acc), (p), (s))
#define X16_Q8_DOT(acc, u, x) _mm256_dpbusd_avx_epi32((acc), (u), (x))
#define X16_Q8_BIAS(neg8sum)  (16 * (neg8sum)) /* -128 * sum(x) */
#include "serving/engine/kernels_avx2_vf.h"

#include "serving/engine/matmul_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __x86_64__ */
