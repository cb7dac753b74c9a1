/* kernels_neon_i8mm: the kernels of kernels_neon_dotprod.c, with the rows of Q8_0, Q4_0, Q4_K,
 * Q5_K and Q6_K by the int8 matrix multiply (smmla, FEAT_I8MM: Armv8.6, Neoverse V1 and V2 /
 * NVIDIA Grace); matmul.c picks this table when AT_HWCAP says HWCAP_ASIMDDP and AT_HWCAP2
 * HWCAP2_I8MM.
 * The target is set for this file by the pragma, not by Makefile flags, so the rest of the
 * program stays baseline Armv8.0, as kernels_avx2.c does on x86. */
#if defined(__aarch64__) /* the whole file: x86-64 has kernels_avx*.c */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod,i8mm"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
#endif

#include "serving/engine/fwd_kernels.h"
#include "serving/engine/gguf.h"
#include "serving/engine/matmul_kernels.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"

/* clang 14's arm_neon.h declares the dot-product (and i8mm) intrinsics only under the feature
 * macros, not for functions that the target attribute above enables: say so before it. */
#if defined(__clang__) && !defined(__ARM_FEATURE_DOTPROD)
#define __ARM_FEATURE_DOTPROD 1
#endif
#if defined(__clang__) && !defined(__ARM_FEATURE_MATMUL_INT8)
#define __ARM_FEATURE_MATMUL_INT8 1
#endif
#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KNAME(x)           x##_i8mm
#define ISA_NAME           "i8mm"
#define NEON_I8MM          1
#define DOT_S8(acc, a, b)  vdotq_s32((acc), (a), (b))
#define DOT4_S8(acc, a, b) vdotq_s32((acc), (a), (b)) /* sdot's lanes are those */

#include "serving/engine/matmul_neon.inc"
#include "serving/engine/fwd_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __aarch64__ */
