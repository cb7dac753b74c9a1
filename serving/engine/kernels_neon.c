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

#include "serving/engine/matmul_neon.inc"
#include "serving/engine/fwd_simd.inc"
#endif /* __aarch64__ */
