/* k_quant: the ggml block formats on the device (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K, IQ4_XS): dequantization, bit-identical to quant.c's, and the integer dot of
 * one 16-byte chunk of quants with activations quantized as the CPU engine quantizes them (ggml's
 * vec_dot_type: Q8_K for the super-blocks, Q8_0 / Q8_1 for the 32-element blocks).
 *
 * Written in the common subset of C11 and CUDA C++: the kernels include it (k_gemvq.cuh,
 * k_gemm.cuh, k_embed.cuh) and tests/unit/test_cuda.c includes it too and runs the very same
 * functions on the CPU against quant.c, with no GPU. Intrinsics go through kq_* wrappers with a
 * host definition; every float operation of a dequantization or a per-block sum is an explicit
 * kq_mul/kq_add/kq_sub (round to nearest, never contracted into an FMA), in quant.c's order.
 *
 * Device layout (cuda_plan.c's cuda_block_format, filled by k_repack_planes): a matrix of rows x
 * nb blocks keeps each block's fields in up to four planes, block i of plane P at P + i * bytes:
 *
 *   type    qs (quants)   e (high bits)  s (sub-scales)  d (scales)
 *   Q8_0    32 qs         -              -               2  d
 *   Q4_0    16 qs         -              -               2  d
 *   Q4_1    16 qs         -              -               4  d, m
 *   Q5_0    16 qs         4  qh          -               2  d
 *   Q5_1    16 qs         4  qh          -               4  d, m
 *   IQ4_NL  16 qs         -              -               2  d
 *   Q2_K    64 qs         -              16 scales       4  d, dmin
 *   Q3_K    64 qs         32 hmask       12 scales       2  d
 *   Q4_K    128 qs        -              -               16 d, dmin, scales[12]
 *   Q5_K    128 qs        32 qh          -               16 d, dmin, scales[12]
 *   Q6_K    128 ql        64 qh          16 scales       2  d
 *   IQ4_XS  128 qs        -              -               8  d, scales_h, scales_l[4]
 *
 * so a lane's 16-byte load of qs is one aligned vector load and a warp's 32 lanes read 512
 * contiguous bytes. A "chunk" is 16 bytes of qs: 32 weights (16 for Q8_0, 64 for Q2_K/Q3_K), 1
 * chunk per block for the 32-element nibble formats, 2 for Q8_0, 4 for Q2_K and Q3_K, 8 for the
 * other super-blocks. */
#ifndef STRATA_K_QUANT_CUH
#define STRATA_K_QUANT_CUH

#include <stdint.h>

#ifdef __CUDACC__
#define KQ_FN     __device__ __forceinline__
#define KQ_UNROLL _Pragma("unroll")
#else
#include "serving/engine/quant.h"

#include <string.h>
#define KQ_FN static inline
#define KQ_UNROLL
#endif

/* ggml type numbers (gguf.h's GGML_*), for the device side which does not include gguf.h. */
enum {
    KQ_Q4_0 = 2,
    KQ_Q4_1 = 3,
    KQ_Q5_0 = 6,
    KQ_Q5_1 = 7,
    KQ_Q8_0 = 8,
    KQ_Q2_K = 10,
    KQ_Q3_K = 11,
    KQ_Q4_K = 12,
    KQ_Q5_K = 13,
    KQ_Q6_K = 14,
    KQ_IQ4_NL = 20,
    KQ_IQ4_XS = 23,
};

/* The two families of quantized GEMV: activations as Q8_K (256) or as Q8_0/Q8_1 (32). */
KQ_FN int kq_is_super(int t)
{
    return t == KQ_Q2_K || t == KQ_Q3_K || t == KQ_Q4_K || t == KQ_Q5_K || t == KQ_Q6_K ||
           t == KQ_IQ4_XS;
}
KQ_FN int kq_is_32(int t)
{
    return t == KQ_Q8_0 || t == KQ_Q4_0 || t == KQ_Q4_1 || t == KQ_Q5_0 || t == KQ_Q5_1 ||
           t == KQ_IQ4_NL;
}
KQ_FN int kq_is_block(int t)
{
    return kq_is_super(t) || kq_is_32(t);
}
KQ_FN int kq_block_elems(int t)
{
    return kq_is_super(t) ? 256 : 32;
}
/* Bytes per block in each plane (see the table above). */
KQ_FN int kq_qs_bytes(int t)
{
    return t == KQ_Q8_0 ? 32 : kq_is_32(t) ? 16 : (t == KQ_Q2_K || t == KQ_Q3_K) ? 64 : 128;
}
KQ_FN int kq_e_bytes(int t)
{
    return t == KQ_Q5_0 || t == KQ_Q5_1   ? 4
           : t == KQ_Q3_K || t == KQ_Q5_K ? 32
           : t == KQ_Q6_K                 ? 64
                                          : 0;
}
KQ_FN int kq_s_bytes(int t)
{
    return t == KQ_Q2_K || t == KQ_Q6_K ? 16 : t == KQ_Q3_K ? 12 : 0;
}
KQ_FN int kq_d_bytes(int t)
{
    return t == KQ_Q4_K || t == KQ_Q5_K                   ? 16
           : t == KQ_IQ4_XS                               ? 8
           : t == KQ_Q4_1 || t == KQ_Q5_1 || t == KQ_Q2_K ? 4
                                                          : 2;
}
/* 16-byte chunks of qs per block. */
KQ_FN int kq_chunks(int t)
{
    return kq_qs_bytes(t) / 16;
}

/* A matrix's planes (device pointers on the GPU, host pointers in the tests). */
struct kq_planes {
    const uint8_t *qs, *e, *s, *d;
};

/* ---- intrinsics with a host definition -------------------------------------------------------- */

/* Sum of the four signed byte products of a and b, plus c. */
KQ_FN int kq_dp4a(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; i++) c += (int8_t)(a >> (8 * i)) * (int8_t)(b >> (8 * i));
    return c;
#endif
}

/* Byte n of the result is byte ((s >> 4n) & 7) of the 8 bytes y:x (selector nibbles <= 7). */
KQ_FN uint32_t kq_prmt(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) {
        uint32_t i = (s >> (4 * n)) & 7;
        r |= ((i < 4 ? x >> (8 * i) : y >> (8 * (i - 4))) & 0xff) << (8 * n);
    }
    return r;
#endif
}

KQ_FN float kq_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
KQ_FN float kq_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
KQ_FN float kq_sub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
KQ_FN float kq_div(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
/* Round to nearest, ties to even (|v| < 2^22, as the CPU's round_even). */
KQ_FN int kq_rint(float v)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(v);
#else
    float t = v + 12582912.f;
    uint32_t i;
    memcpy(&i, &t, 4);
    return (int)(i & 0x007fffff) - 0x00400000;
#endif
}
/* IEEE half bits -> float, and a float rounded to the nearest half (as f32_to_fp16). */
KQ_FN float kq_h2f(uint32_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffff)));
#else
    return fp16_to_f32((uint16_t)h);
#endif
}
KQ_FN float kq_f16r(float f)
{
#ifdef __CUDA_ARCH__
    return __half2float(__float2half_rn(f));
#else
    return fp16_to_f32(f32_to_fp16(f));
#endif
}

/* Loads of 16, 8, 4 and 2 bytes (p aligned to its size). On the device the 16-byte load of
 * weights is non-coherent and does not allocate in L1: weights stream through once, and L1 is
 * left to the activations every warp rereads. */
KQ_FN void kq_ld16(const uint8_t *p, uint32_t *w)
{
#ifdef __CUDA_ARCH__
    uint32_t a, b, c, d;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(p));
    w[0] = a, w[1] = b, w[2] = c, w[3] = d;
#else
    memcpy(w, p, 16);
#endif
}
KQ_FN void kq_ld8(const uint8_t *p, uint32_t *w)
{
#ifdef __CUDA_ARCH__
    uint2 v = __ldg((const uint2 *)p);
    w[0] = v.x, w[1] = v.y;
#else
    memcpy(w, p, 8);
#endif
}
KQ_FN uint32_t kq_ld4(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const uint32_t *)p);
#else
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
#endif
}
KQ_FN uint32_t kq_ld2(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const unsigned short *)p);
#else
    uint16_t w;
    memcpy(&w, p, 2);
    return w;
#endif
}
/* 16 bytes of a weight plane into b[] (p 16-byte aligned: every dequantization's quants are). */
KQ_FN void kq_ld16b(const uint8_t *p, uint8_t *b)
{
#ifdef __CUDA_ARCH__
    uint4 v = __ldg((const uint4 *)p);
    memcpy(b, &v, 16);
#else
    memcpy(b, p, 16);
#endif
}
/* 16 activation bytes (shared memory on the device, 16-byte aligned). */
KQ_FN void kq_lda16(const int8_t *p, uint32_t *w)
{
#ifdef __CUDA_ARCH__
    int4 v = *(const int4 *)p;
    w[0] = (uint32_t)v.x, w[1] = (uint32_t)v.y, w[2] = (uint32_t)v.z, w[3] = (uint32_t)v.w;
#else
    memcpy(w, p, 16);
#endif
}

/* 16 activation bytes of the super-block family (Q8_K), p the logical address. k_gemvq lays those
 * out in shared memory with the four 16-byte pieces of every 64-byte group permuted (piece i at
 * i ^ bits 7-8 of the address: kq_swz), so that the 8 lanes of a 128-bit load phase that read
 * 64 bytes apart (kq_dot_q4k_unit's lanes) land on distinct banks. On the host: plain memory. */
#ifdef __CUDA_ARCH__
extern __shared__ __align__(1024) uint8_t gemvq_smem[]; /* k_gemvq's dynamic shared memory */
/* The shared-memory address of logical byte offset o of gemvq_smem (o 16-byte aligned). */
__device__ __forceinline__ unsigned kq_swz(unsigned o)
{
    return (unsigned)__cvta_generic_to_shared(gemvq_smem) + (o ^ ((o >> 3) & 0x30u));
}
#endif
KQ_FN void kq_ldas16(const int8_t *p, uint32_t *w)
{
#ifdef __CUDA_ARCH__
    unsigned s = kq_swz((unsigned)((const uint8_t *)p - gemvq_smem));
    uint32_t a, b, c, d;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "r"(s));
    w[0] = a, w[1] = b, w[2] = c, w[3] = d;
#else
    memcpy(w, p, 16);
#endif
}

/* ---- small helpers ---------------------------------------------------------------------------- */

KQ_FN int kq_u16(const uint8_t *p)
{
    return p[0] | p[1] << 8;
}
/* Byte j (0..15) of four words, as unsigned and as signed. */
KQ_FN int kq_byte16(const uint32_t *w, int j)
{
    uint32_t v = j < 8 ? (j < 4 ? w[0] : w[1]) : (j < 12 ? w[2] : w[3]);
    return (int)((v >> (8 * (j & 3))) & 0xff);
}
KQ_FN int kq_sbyte16(const uint32_t *w, int j)
{
    return (int8_t)kq_byte16(w, j);
}

/* kvalues_iq4nl as four little-endian words: -127 -104 -83 -65 | -49 -35 -22 -10 | 1 13 25 38 |
 * 53 69 89 113. */
#define KQ_IQ4_T0 0xBFAD9881u
#define KQ_IQ4_T1 0xF6EADDCFu
#define KQ_IQ4_T2 0x26190D01u
#define KQ_IQ4_T3 0x71594535u

/* Four IQ4 levels: v holds four indices 0..15 (one per byte), the result the four int8 levels. */
KQ_FN uint32_t kq_iq4_lut(uint32_t v)
{
    uint32_t sel = (v & 7) | ((v >> 4) & 0x70) | ((v >> 8) & 0x700) | ((v >> 12) & 0x7000);
    uint32_t lo = kq_prmt(KQ_IQ4_T0, KQ_IQ4_T1, sel), hi = kq_prmt(KQ_IQ4_T2, KQ_IQ4_T3, sel);
    uint32_t m = ((v >> 3) & 0x01010101u) * 0xffu; /* 0xff in the bytes whose index is >= 8 */
    return (lo & ~m) | (hi & m);
}
/* One level (dequantization). */
KQ_FN int kq_iq4_level(int i)
{
    uint32_t w = i < 8 ? (i < 4 ? KQ_IQ4_T0 : KQ_IQ4_T1) : (i < 12 ? KQ_IQ4_T2 : KQ_IQ4_T3);
    return (int8_t)(w >> (8 * (i & 3)));
}

/* Bits 0..3 of t to bit 0 of bytes 0..3. */
KQ_FN uint32_t kq_spread4(uint32_t t)
{
    return ((t & 15) * 0x00204081u) & 0x01010101u;
}

/* Q4_K/Q5_K sub-block j's 6-bit scale and min (quant.h q4_K_scale_min) from the 12 scale bytes
 * as three words s0 (bytes 0-3), s1 (4-7), s2 (8-11). */
KQ_FN void kq_k4_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, int *sc, int *m)
{
    int sh = 8 * (j & 3);
    int b0 = (s0 >> sh) & 0xff, b1 = (s1 >> sh) & 0xff, b2 = (s2 >> sh) & 0xff;
    if (j < 4) {
        *sc = b0 & 63;
        *m = b1 & 63;
    } else {
        *sc = (b2 & 15) | (b0 >> 6) << 4;
        *m = (b2 >> 4) | (b1 >> 6) << 4;
    }
}
/* Q3_K sub-block j's 6-bit scale (quant.h q3_K_scale; the format subtracts 32), same words. */
KQ_FN int kq_k3_scale(uint32_t s0, uint32_t s1, uint32_t s2, int j)
{
    int sh = 8 * (j & 3);
    int b = (int)(((j & 4) ? s1 : s0) >> sh) & 0xff;
    int lo = j < 8 ? b & 15 : b >> 4;
    int hi = (int)((s2 >> sh) >> (2 * (j >> 2))) & 3;
    return lo | hi << 4;
}

/* ---- dequantization: 16 elements o..o+15 (o % 16 == 0) of block bi, as quant.c computes them --- */

KQ_FN void kq_deq16_q8_0(const struct kq_planes *p, long long bi, int o, float *y)
{
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 32 + o, q);
    float d = kq_h2f((uint32_t)kq_u16(p->d + bi * 2));
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_mul((float)(int8_t)q[i], d);
}

KQ_FN void kq_deq16_q4_0(const struct kq_planes *p, long long bi, int o, float *y)
{
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 16, q);
    float d = kq_h2f((uint32_t)kq_u16(p->d + bi * 2));
    int sh = o >= 16 ? 4 : 0;
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_mul((float)(((q[i] >> sh) & 15) - 8), d);
}

KQ_FN void kq_deq16_q4_1(const struct kq_planes *p, long long bi, int o, float *y)
{
    const uint8_t *dm = p->d + bi * 4;
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 16, q);
    float d = kq_h2f((uint32_t)kq_u16(dm)), m = kq_h2f((uint32_t)kq_u16(dm + 2));
    int sh = o >= 16 ? 4 : 0;
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_add(kq_mul((float)((q[i] >> sh) & 15), d), m);
}

KQ_FN void kq_deq16_q5(int type, const struct kq_planes *p, long long bi, int o, float *y)
{
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 16, q);
    uint32_t qh = (uint32_t)p->e[bi * 4] | (uint32_t)p->e[bi * 4 + 1] << 8 |
                  (uint32_t)p->e[bi * 4 + 2] << 16 | (uint32_t)p->e[bi * 4 + 3] << 24;
    int sh = o >= 16 ? 4 : 0;
    if (type == KQ_Q5_0) {
        float d = kq_h2f((uint32_t)kq_u16(p->d + bi * 2));
        KQ_UNROLL
        for (int i = 0; i < 16; i++) {
            int v = ((q[i] >> sh) & 15) | (int)((qh >> (o + i)) & 1) << 4;
            y[i] = kq_mul((float)(v - 16), d);
        }
    } else {
        const uint8_t *dm = p->d + bi * 4;
        float d = kq_h2f((uint32_t)kq_u16(dm)), m = kq_h2f((uint32_t)kq_u16(dm + 2));
        KQ_UNROLL
        for (int i = 0; i < 16; i++) {
            int v = ((q[i] >> sh) & 15) | (int)((qh >> (o + i)) & 1) << 4;
            y[i] = kq_add(kq_mul((float)v, d), m);
        }
    }
}

KQ_FN void kq_deq16_iq4_nl(const struct kq_planes *p, long long bi, int o, float *y)
{
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 16, q);
    float d = kq_h2f((uint32_t)kq_u16(p->d + bi * 2));
    int sh = o >= 16 ? 4 : 0;
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_mul(d, (float)kq_iq4_level((q[i] >> sh) & 15));
}

KQ_FN void kq_deq16_q2_K(const struct kq_planes *p, long long bi, int o, float *y)
{
    const uint8_t *dd = p->d + bi * 4;
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 64 + 32 * (o / 128) + (o & 31), q);
    int sc = p->s[bi * 16 + o / 16], sh = 2 * ((o & 127) / 32);
    float d = kq_h2f((uint32_t)kq_u16(dd)), dmin = kq_h2f((uint32_t)kq_u16(dd + 2));
    float dl = kq_mul(d, (float)(sc & 15)), ml = kq_mul(dmin, (float)(sc >> 4));
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_sub(kq_mul(dl, (float)((q[i] >> sh) & 3)), ml);
}

KQ_FN void kq_deq16_q3_K(const struct kq_planes *p, long long bi, int o, float *y)
{
    const uint8_t *sc = p->s + bi * 12;
    uint8_t q[16], hm[16];
    kq_ld16b(p->qs + bi * 64 + 32 * (o / 128) + (o & 31), q);
    kq_ld16b(p->e + bi * 32 + (o & 31), hm);
    uint32_t s0 =
        (uint32_t)sc[0] | (uint32_t)sc[1] << 8 | (uint32_t)sc[2] << 16 | (uint32_t)sc[3] << 24;
    uint32_t s1 =
        (uint32_t)sc[4] | (uint32_t)sc[5] << 8 | (uint32_t)sc[6] << 16 | (uint32_t)sc[7] << 24;
    uint32_t s2 =
        (uint32_t)sc[8] | (uint32_t)sc[9] << 8 | (uint32_t)sc[10] << 16 | (uint32_t)sc[11] << 24;
    int s = (o & 127) / 32, hb = o / 32; /* hmask bit: element / 32 */
    float dl = kq_mul(kq_h2f((uint32_t)kq_u16(p->d + bi * 2)),
                      (float)(kq_k3_scale(s0, s1, s2, o / 16) - 32));
    KQ_UNROLL
    for (int i = 0; i < 16; i++) {
        int v = (q[i] >> (2 * s)) & 3;
        v -= (hm[i] >> hb) & 1 ? 0 : 4;
        y[i] = kq_mul(dl, (float)v);
    }
}

/* Q4_K (e == NULL) and Q5_K. */
KQ_FN void kq_deq16_q45_K(const struct kq_planes *p, long long bi, int o, int q5, float *y)
{
    int g = o / 64, hi = (o / 32) & 1, l0 = o & 31;
    uint8_t h[16], q[16], qh[16] = {0};
    kq_ld16b(p->d + bi * 16, h);
    kq_ld16b(p->qs + bi * 128 + 32 * g + l0, q);
    if (q5) kq_ld16b(p->e + bi * 32 + l0, qh);
    uint32_t s0 =
        (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
    uint32_t s1 =
        (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
    uint32_t s2 =
        (uint32_t)h[12] | (uint32_t)h[13] << 8 | (uint32_t)h[14] << 16 | (uint32_t)h[15] << 24;
    int sc, m;
    kq_k4_scale_min(s0, s1, s2, 2 * g + hi, &sc, &m);
    float d1 = kq_mul(kq_h2f((uint32_t)kq_u16(h)), (float)sc);
    float m1 = kq_mul(kq_h2f((uint32_t)kq_u16(h + 2)), (float)m);
    KQ_UNROLL
    for (int i = 0; i < 16; i++) {
        int v = (q[i] >> (4 * hi)) & 15;
        if (q5) v += (qh[i] >> (2 * g + hi)) & 1 ? 16 : 0;
        y[i] = kq_sub(kq_mul(d1, (float)v), m1);
    }
}

KQ_FN void kq_deq16_q6_K(const struct kq_planes *p, long long bi, int o, float *y)
{
    int hh = o / 128, s = (o & 127) / 32, l0 = o & 31;
    uint8_t ql[16], qh[16];
    kq_ld16b(p->qs + bi * 128 + 64 * hh + l0 + 32 * (s & 1), ql);
    kq_ld16b(p->e + bi * 64 + 32 * hh + l0, qh);
    float dsc =
        kq_mul(kq_h2f((uint32_t)kq_u16(p->d + bi * 2)), (float)(int8_t)p->s[bi * 16 + o / 16]);
    KQ_UNROLL
    for (int i = 0; i < 16; i++) {
        int v = (s < 2 ? ql[i] & 15 : ql[i] >> 4) | ((qh[i] >> (2 * s)) & 3) << 4;
        y[i] = kq_mul(dsc, (float)(v - 32));
    }
}

KQ_FN void kq_deq16_iq4_xs(const struct kq_planes *p, long long bi, int o, float *y)
{
    const uint8_t *h = p->d + bi * 8;
    int ib = o / 32, sh = (o & 16) ? 4 : 0;
    int ls = ((h[4 + ib / 2] >> (4 * (ib & 1))) & 15) | ((kq_u16(h + 2) >> (2 * ib)) & 3) << 4;
    float dl = kq_mul(kq_h2f((uint32_t)kq_u16(h)), (float)(ls - 32));
    uint8_t q[16];
    kq_ld16b(p->qs + bi * 128 + 16 * ib, q);
    KQ_UNROLL
    for (int i = 0; i < 16; i++) y[i] = kq_mul(dl, (float)kq_iq4_level((q[i] >> sh) & 15));
}

/* Any block type: elements c..c+15 (c % 16 == 0) of row r of a matrix with `cols` columns. */
KQ_FN void kq_deq16(int type, const struct kq_planes *p, int r, int cols, int c, float *y)
{
    int be = kq_block_elems(type);
    long long bi = (long long)r * (cols / be) + c / be;
    int o = c % be;
    switch (type) {
    case KQ_Q8_0:
        kq_deq16_q8_0(p, bi, o, y);
        break;
    case KQ_Q4_0:
        kq_deq16_q4_0(p, bi, o, y);
        break;
    case KQ_Q4_1:
        kq_deq16_q4_1(p, bi, o, y);
        break;
    case KQ_Q5_0:
    case KQ_Q5_1:
        kq_deq16_q5(type, p, bi, o, y);
        break;
    case KQ_IQ4_NL:
        kq_deq16_iq4_nl(p, bi, o, y);
        break;
    case KQ_Q2_K:
        kq_deq16_q2_K(p, bi, o, y);
        break;
    case KQ_Q3_K:
        kq_deq16_q3_K(p, bi, o, y);
        break;
    case KQ_Q4_K:
    case KQ_Q5_K:
        kq_deq16_q45_K(p, bi, o, type == KQ_Q5_K, y);
        break;
    case KQ_Q6_K:
        kq_deq16_q6_K(p, bi, o, y);
        break;
    case KQ_IQ4_XS:
        kq_deq16_iq4_xs(p, bi, o, y);
        break;
    }
}

/* ---- the quantized dot product: one chunk -------------------------------------------------------
 * kq_load_<type> reads what chunk k of block bi needs into a kq_chunk (issued early, all loads
 * aligned vectors); kq_dot_<type> returns the chunk's contribution for one token:
 *   super-blocks: aq = the token's 256 quantized activations of this block, ad its scale, bs its
 *     16 sums of 16 (ggml's Q8_K);
 *   32-blocks: aq = the 32 quantized activations, ad = d and as = d * sum rounded to f16, asum
 *     = sum (ggml's Q8_0 / Q8_1 as the CPU's AVX2 path makes them).
 * The integer part is exact; the float part is the CPU's per-block expression restricted to the
 * chunk's sub-blocks: (d_w * ad) * isum - (dmin_w * ad) * msum, or (d_w * ad) * dot + m_w * as. */

struct kq_chunk {
    uint32_t q[4]; /* 16 bytes of qs */
    uint32_t e[4]; /* the high bits for these quants (Q3_K, Q5_K, Q6_K: 16 bytes; Q5_x: qh) */
    uint32_t h[4]; /* scales: Q4_K/Q5_K/IQ4_XS the d plane; Q3_K the 12 scale bytes; Q2_K the
                    * 8 of this half; Q6_K the two this chunk uses, one a word */
    uint32_t d;    /* f16 d (and dmin / m above it), where h does not hold them */
};

KQ_FN void kq_load(int type, const struct kq_planes *p, long long bi, int k, struct kq_chunk *c)
{
    switch (type) {
    case KQ_Q4_1:
    case KQ_Q5_1:
        kq_ld16(p->qs + bi * 16, c->q);
        c->d = kq_ld4(p->d + bi * 4);
        if (type == KQ_Q5_1) c->e[0] = kq_ld4(p->e + bi * 4);
        break;
    case KQ_Q5_0:
        kq_ld16(p->qs + bi * 16, c->q);
        c->e[0] = kq_ld4(p->e + bi * 4);
        c->d = kq_ld2(p->d + bi * 2);
        break;
    case KQ_Q8_0:
        kq_ld16(p->qs + bi * 32 + 16 * k, c->q);
        c->d = kq_ld2(p->d + bi * 2);
        break;
    case KQ_Q4_0:
    case KQ_IQ4_NL:
        kq_ld16(p->qs + bi * 16, c->q);
        c->d = kq_ld2(p->d + bi * 2);
        break;
    case KQ_Q2_K: /* the scales of sub-blocks 8 hh .. 8 hh + 7 (this chunk's: 2s + (k & 1)) */
        kq_ld16(p->qs + bi * 64 + 16 * k, c->q);
        kq_ld8(p->s + bi * 16 + 8 * (k >> 1), c->h);
        c->d = kq_ld4(p->d + bi * 4);
        break;
    case KQ_Q3_K:
        kq_ld16(p->qs + bi * 64 + 16 * k, c->q);
        kq_ld16(p->e + bi * 32 + 16 * (k & 1), c->e);
        c->h[0] = kq_ld4(p->s + bi * 12);
        c->h[1] = kq_ld4(p->s + bi * 12 + 4);
        c->h[2] = kq_ld4(p->s + bi * 12 + 8);
        c->d = kq_ld2(p->d + bi * 2);
        break;
    case KQ_Q4_K:
    case KQ_Q5_K:
        kq_ld16(p->qs + bi * 128 + 16 * k, c->q);
        kq_ld16(p->d + bi * 16, c->h);
        if (type == KQ_Q5_K) kq_ld16(p->e + bi * 32 + 16 * (k & 1), c->e);
        break;
    case KQ_Q6_K: { /* the two scales this chunk's sub-blocks use (see kq_dot_super) */
        int j = 8 * (k >> 2) + 2 * ((k & 3) >> 1) + (k & 1);
        kq_ld16(p->qs + bi * 128 + 16 * k, c->q);
        kq_ld16(p->e + bi * 64 + 32 * (k >> 2) + 16 * (k & 1), c->e);
        c->h[0] = p->s[bi * 16 + j];
        c->h[1] = p->s[bi * 16 + j + 4];
        c->d = kq_ld2(p->d + bi * 2);
        break;
    }
    case KQ_IQ4_XS:
        kq_ld16(p->qs + bi * 128 + 16 * k, c->q);
        kq_ld8(p->d + bi * 8, c->h);
        break;
    }
}

/* sum over w of dp4a(a[w], b[w]) */
KQ_FN int kq_dot16(const uint32_t *a, const uint32_t *b)
{
    int s = 0;
    KQ_UNROLL
    for (int w = 0; w < 4; w++) s = kq_dp4a(a[w], b[w], s);
    return s;
}

/* Super-blocks (Q8_K activations). */
KQ_FN float kq_dot_super(int type, const struct kq_chunk *c, int k, const int8_t *aq, float ad,
                         const int16_t *bs)
{
    uint32_t A[4], B[4], lo[4], hi[4];
    int isum = 0, msum = 0;
    float d, dmin = 0.f;
    switch (type) {
    case KQ_Q4_K:
    case KQ_Q5_K: {
        int g = k >> 1, h = k & 1, sc0, m0, sc1, m1;
        kq_ldas16(aq + 64 * g + 16 * h, A);
        kq_ldas16(aq + 64 * g + 32 + 16 * h, B);
        KQ_UNROLL
        for (int w = 0; w < 4; w++) {
            lo[w] = c->q[w] & 0x0F0F0F0Fu;
            hi[w] = (c->q[w] >> 4) & 0x0F0F0F0Fu;
            if (type == KQ_Q5_K) {
                lo[w] |= ((c->e[w] >> (2 * g)) & 0x01010101u) << 4;
                hi[w] |= ((c->e[w] >> (2 * g + 1)) & 0x01010101u) << 4;
            }
        }
        kq_k4_scale_min(c->h[1], c->h[2], c->h[3], 2 * g, &sc0, &m0);
        kq_k4_scale_min(c->h[1], c->h[2], c->h[3], 2 * g + 1, &sc1, &m1);
        isum = sc0 * kq_dot16(lo, A) + sc1 * kq_dot16(hi, B);
        msum = m0 * bs[4 * g + h] + m1 * bs[4 * g + 2 + h];
        d = kq_h2f(c->h[0]);
        dmin = kq_h2f(c->h[0] >> 16);
        break;
    }
    case KQ_Q6_K: {
        int hh = k >> 2, p = k & 3, slo = p >> 1, shi = 2 + slo, l0 = 16 * (p & 1);
        kq_ldas16(aq + 128 * hh + 32 * slo + l0, A);
        kq_ldas16(aq + 128 * hh + 32 * shi + l0, B);
        KQ_UNROLL
        for (int w = 0; w < 4; w++) {
            lo[w] = (c->q[w] & 0x0F0F0F0Fu) | ((c->e[w] >> (2 * slo)) & 0x03030303u) << 4;
            hi[w] = ((c->q[w] >> 4) & 0x0F0F0F0Fu) | ((c->e[w] >> (2 * shi)) & 0x03030303u) << 4;
        }
        int jlo = 8 * hh + 2 * slo + (p & 1), jhi = jlo + 4;
        isum = (int8_t)c->h[0] * (kq_dot16(lo, A) - 32 * bs[jlo]) +
               (int8_t)c->h[1] * (kq_dot16(hi, B) - 32 * bs[jhi]);
        d = kq_h2f(c->d);
        break;
    }
    case KQ_Q2_K:
    case KQ_Q3_K: {
        int hh = k >> 1, l0 = 16 * (k & 1);
        KQ_UNROLL
        for (int s = 0; s < 4; s++) {
            int j = 8 * hh + 2 * s + (k & 1);
            kq_ldas16(aq + 128 * hh + 32 * s + l0, A);
            KQ_UNROLL
            for (int w = 0; w < 4; w++) {
                lo[w] = (c->q[w] >> (2 * s)) & 0x03030303u;
                if (type == KQ_Q3_K) lo[w] |= ((c->e[w] >> (4 * hh + s)) & 0x01010101u) << 2;
            }
            int dot = kq_dot16(lo, A);
            if (type == KQ_Q3_K) {
                isum += (kq_k3_scale(c->h[0], c->h[1], c->h[2], j) - 32) * (dot - 4 * bs[j]);
            } else {
                int sc = kq_byte16(c->h, 2 * s + (k & 1));
                isum += (sc & 15) * dot;
                msum += (sc >> 4) * bs[j];
            }
        }
        d = kq_h2f(c->d);
        if (type == KQ_Q2_K) dmin = kq_h2f(c->d >> 16);
        break;
    }
    default: { /* KQ_IQ4_XS: chunk k is sub-block k */
        kq_ldas16(aq + 32 * k, A);
        kq_ldas16(aq + 32 * k + 16, B);
        KQ_UNROLL
        for (int w = 0; w < 4; w++) {
            lo[w] = kq_iq4_lut(c->q[w] & 0x0F0F0F0Fu);
            hi[w] = kq_iq4_lut((c->q[w] >> 4) & 0x0F0F0F0Fu);
        }
        int ls = (int)((c->h[1] >> (8 * (k >> 1) + 4 * (k & 1))) & 15) |
                 (int)((c->h[0] >> (16 + 2 * k)) & 3) << 4;
        isum = (ls - 32) * (kq_dot16(lo, A) + kq_dot16(hi, B));
        d = kq_h2f(c->h[0]);
        break;
    }
    }
    float r = kq_mul(kq_mul(d, ad), (float)isum);
    if (type == KQ_Q2_K || type == KQ_Q4_K || type == KQ_Q5_K)
        r = kq_sub(r, kq_mul(kq_mul(dmin, ad), (float)msum));
    return r;
}

/* Q4_K by units of 32 bytes of quants, sub-blocks 2g and 2g+1 of one block (64 weights): q the
 * unit's 8 words of qs, h the block's d plane (d, dmin, 12 bytes of scales), aq the block's 256
 * quantized activations, ad their scale, bs their 16 sums. The same integers as kq_dot_super's
 * chunks 2g and 2g+1 together, with the scales decoded and the block's floats applied once for
 * the two (the GEMV at batch 1 is bound by instructions a byte, not by the bytes). */
KQ_FN float kq_dot_q4k_unit(const uint32_t *q, const uint32_t *h, int g, const int8_t *aq, float ad,
                            const int16_t *bs)
{
    uint32_t A[4], lo[4], hi[4];
    int sc0, m0, sc1, m1, dl = 0, dh = 0;
    kq_k4_scale_min(h[1], h[2], h[3], 2 * g, &sc0, &m0);
    kq_k4_scale_min(h[1], h[2], h[3], 2 * g + 1, &sc1, &m1);
    KQ_UNROLL
    for (int half = 0; half < 2; half++) {
        KQ_UNROLL
        for (int w = 0; w < 4; w++) {
            lo[w] = q[4 * half + w] & 0x0F0F0F0Fu;
            hi[w] = (q[4 * half + w] >> 4) & 0x0F0F0F0Fu;
        }
        kq_ldas16(aq + 64 * g + 16 * half, A);
        dl += kq_dot16(lo, A);
        kq_ldas16(aq + 64 * g + 32 + 16 * half, A);
        dh += kq_dot16(hi, A);
    }
    int isum = sc0 * dl + sc1 * dh;
    int msum = m0 * (bs[4 * g] + bs[4 * g + 1]) + m1 * (bs[4 * g + 2] + bs[4 * g + 3]);
    float r = kq_mul(kq_mul(kq_h2f(h[0]), ad), (float)isum);
    return kq_sub(r, kq_mul(kq_mul(kq_h2f(h[0] >> 16), ad), (float)msum));
}

/* 32-element blocks (Q8_0 / Q8_1 activations). Q8_0's chunk k is half k of the block: its
 * integers go straight into dp4a and each half is scaled on its own. */
KQ_FN float kq_dot_32(int type, const struct kq_chunk *c, int k, const int8_t *aq, float ad,
                      float as, int asum)
{
    uint32_t A[4], B[4], lo[4], hi[4];
    if (type == KQ_Q8_0) {
        kq_lda16(aq + 16 * k, A);
        return kq_mul(kq_mul(kq_h2f(c->d), ad), (float)kq_dot16(c->q, A));
    }
    kq_lda16(aq, A);
    kq_lda16(aq + 16, B);
    KQ_UNROLL
    for (int w = 0; w < 4; w++) {
        lo[w] = c->q[w] & 0x0F0F0F0Fu;
        hi[w] = (c->q[w] >> 4) & 0x0F0F0F0Fu;
        if (type == KQ_Q5_0 || type == KQ_Q5_1) {
            lo[w] |= kq_spread4(c->e[0] >> (4 * w)) << 4;
            hi[w] |= kq_spread4(c->e[0] >> (16 + 4 * w)) << 4;
        } else if (type == KQ_IQ4_NL) {
            lo[w] = kq_iq4_lut(lo[w]);
            hi[w] = kq_iq4_lut(hi[w]);
        }
    }
    int dot = kq_dot16(lo, A) + kq_dot16(hi, B);
    if (type == KQ_Q5_0) dot -= 16 * asum;
    if (type == KQ_Q4_0) dot -= 8 * asum;
    float r = kq_mul(kq_mul(kq_h2f(c->d), ad), (float)dot);
    if (type == KQ_Q4_1 || type == KQ_Q5_1) r = kq_add(r, kq_mul(kq_h2f(c->d >> 16), as));
    return r;
}

/* ---- activation quantization, per value (the kernels find the block's amax and sum) ---------- */

/* Q8_K (ggml's quantize_row_q8_K): iscale = -127 / max, q = min(127, round(iscale * x)),
 * d = 1 / iscale; an all-zero block is all zero. max is the signed value of largest magnitude;
 * using +amax negates q, d and the sums together, which leaves every product d_w * d * isum
 * exactly as it is, so the kernels take amax. */
KQ_FN float kq_q8k_iscale(float amax)
{
    return kq_div(-127.f, amax);
}
KQ_FN int kq_q8k_q(float iscale, float v)
{
    int q = kq_rint(kq_mul(iscale, v));
    return q < 127 ? q : 127;
}
/* Q8_0 / Q8_1 as ggml's AVX2 quantize_row_q8_0/1 (the CPU engine's): id = 127 / amax (0 for an
 * all-zero block), q = round(x * id), d = amax / 127 rounded to f16, s = d * sum rounded. */
KQ_FN float kq_q8_id(float amax)
{
    return amax > 0.f ? kq_div(127.f, amax) : 0.f;
}
KQ_FN int kq_q8_q(float id, float v)
{
    return kq_rint(kq_mul(v, id));
}
KQ_FN float kq_q8_d(float amax)
{
    return kq_f16r(kq_div(amax, 127.f));
}
KQ_FN float kq_q8_s(float amax, int sum)
{
    return kq_f16r(kq_mul(kq_div(amax, 127.f), (float)sum));
}

#endif
