/* kernels_neon: the kernels of matmul_neon.inc for Advanced SIMD, which every aarch64 CPU has:
 * the integer dots widen (s8 x s8 -> s16 products, pairwise added into s32), four instructions
 * where the dot-product extension (kernels_neon_dotprod.c) takes one. */
#if defined(__aarch64__) /* the whole file: x86-64 has kernels_avx*.c */
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

#define KNAME(x) x##_neon
#define ISA_NAME "neon"

/* |product| <= 128 * 128 fits s16; vpadal adds pairs of them into the s32 lanes. */
static inline __attribute__((always_inline)) int32x4_t dot_s8_widen(int32x4_t acc, int8x16_t a,
                                                                    int8x16_t b)
{
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#define DOT_S8(acc, a, b) dot_s8_widen((acc), (a), (b))
/* Lane j gets bytes 4j .. 4j+3: the s16 products summed by pairs, then the pairs by pairs. */
static inline __attribute__((always_inline)) int32x4_t dot4_s8_widen(int32x4_t acc, int8x16_t a,
                                                                     int8x16_t b)
{
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
    return vaddq_s32(acc, vpaddq_s32(lo, hi));
}
#define DOT4_S8(acc, a, b) dot4_s8_widen((acc), (a), (b))

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
#endif /* __aarch64__ */
