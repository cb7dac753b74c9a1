/* kernels_neon_dotprod: the kernels of matmul_neon.inc with Armv8.2's dot product (sdot: 16
 * s8 x s8 products summed four by four into the s32 lanes, one instruction), which Neoverse N1,
 * V1 and V2 (NVIDIA Grace) have; matmul.c picks this table when AT_HWCAP says HWCAP_ASIMDDP.
 * The target is set for this file by the pragma, not by Makefile flags, so the rest of the
 * program stays baseline Armv8.0, as kernels_avx2.c does on x86. */
#if defined(__aarch64__) /* the whole file: x86-64 has kernels_avx*.c */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
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
#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KNAME(x)           x##_dotprod
#define ISA_NAME           "dotprod"
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
