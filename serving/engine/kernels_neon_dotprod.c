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

#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KNAME(x)           x##_dotprod
#define ISA_NAME           "dotprod"
#define DOT_S8(acc, a, b)  vdotq_s32((acc), (a), (b))
#define DOT4_S8(acc, a, b) vdotq_s32((acc), (a), (b)) /* sdot's lanes are those */

/* fwd_simd.inc's primitives (attention, SwiGLU), 4 floats a vector. */
#define VF              float32x4_t
#define VF_N            4
#define VF_TILE         4 /* query heads per key vector in attention's scores */
#define vf_zero()       vdupq_n_f32(0)
#define vf_load(p)      vld1q_f32(p)
#define vf_load_f16(p)  vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(p))))
#define vf_fma(a, b, c) vfmaq_f32((c), (a), (b)) /* a * b + c */
#define vf_hsum(v)      vaddvq_f32(v)
#define vf_hmax(v)      vmaxvq_f32(v)
#define vf_set1(f)      vdupq_n_f32(f)
#define vf_store(p, v)  vst1q_f32((p), (v))
#define vf_add(a, b)    vaddq_f32((a), (b))
#define vf_sub(a, b)    vsubq_f32((a), (b))
#define vf_mul(a, b)    vmulq_f32((a), (b))
#define vf_div(a, b)    vdivq_f32((a), (b))
#define vf_min(a, b)    vminq_f32((a), (b))
#define vf_max(a, b)    vmaxq_f32((a), (b))
#define vf_round(v)     vrndnq_f32(v) /* to nearest, ties to even */
#define vf_pow2i(n)                                                                                \
    vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23))
#define vf_zero_below(y, x, c)                                                                     \
    vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), vcgeq_f32((x), (c))))
#define vf_store_f16(p, v) vst1_u16((uint16_t *)(p), vreinterpret_u16_f16(vcvt_f16_f32(v)))

#include "serving/engine/matmul_neon.inc"
#include "serving/engine/fwd_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif /* __aarch64__ */
