/* quant: conversions and quantizers against hand-computed ggml bit patterns, the hardware F16C
 * conversion where the CPU has it, and round-trip error bounds. */
#include "serving/engine/gguf.h"
#include "serving/engine/quant.h"
#include "tests/unit/check.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float uniform(void) /* [-1, 1) */
{
    return (float)((int32_t)next_u32()) / 2147483648.0f;
}

#define CHECK_H(f, want)                                                                           \
    CHECKF(f32_to_fp16(f) == (want), "f32_to_fp16(%a) = 0x%04x, expected 0x%04x", (double)(f),     \
           f32_to_fp16(f), (want))

TEST(fp16_edge_cases)
{
    CHECK_H(0.0f, 0x0000);
    CHECK_H(-0.0f, 0x8000);
    CHECK_H(1.0f, 0x3c00);
    CHECK_H(-2.5f, 0xc100);
    CHECK_H(0.1f, 0x2e66);
    CHECK_H(6.342e-5f, 0x0428);           /* just above the smallest normal 2^-14 */
    CHECK_H(0x1p-14f, 0x0400);            /* smallest normal */
    CHECK_H(0x1p-14f - 0x1p-24f, 0x03ff); /* largest subnormal */
    CHECK_H(0x1p-24f, 0x0001);            /* smallest subnormal */
    CHECK_H(0x1p-25f, 0x0000);            /* tie between 0 and 2^-24: to even (0) */
    CHECK_H(0x1.8p-25f, 0x0001);          /* above the tie */
    CHECK_H(0x1.8p-24f, 0x0002);          /* tie between 1 and 2 subnormal steps: to even (2) */
    CHECK_H(0x1.4p-24f, 0x0001);          /* 1.25 steps */
    CHECK_H(1e-7f, 0x0002);
    CHECK_H(1e-30f, 0x0000);
    CHECK_H(1.0f + 0x1p-11f, 0x3c00);            /* tie: to even (1.0) */
    CHECK_H(1.0f + 0x3p-11f, 0x3c02);            /* tie: to even (1+2^-9) */
    CHECK_H(1.0f + 0x1p-11f + 0x1p-23f, 0x3c01); /* just above the tie */
    CHECK_H(65504.0f, 0x7bff);                   /* largest finite */
    CHECK_H(65519.0f, 0x7bff);
    CHECK_H(65520.0f, 0x7c00); /* tie between 65504 and 65536: to even, i.e. infinity */
    CHECK_H(1e10f, 0x7c00);
    CHECK_H(-1e10f, 0xfc00);
    CHECK_H(INFINITY, 0x7c00);
    CHECK_H(-INFINITY, 0xfc00);
    CHECK_H(NAN, 0x7e00);
    CHECK(fp16_to_f32(0x0001) == 0x1p-24f);
    CHECK(fp16_to_f32(0x03ff) == 0x1p-14f - 0x1p-24f);
    CHECK(fp16_to_f32(0x0428) == 0x1.0ap-14f);
    CHECK(bits(fp16_to_f32(0x8000)) == 0x80000000u);
    CHECK(fp16_to_f32(0x7c00) == INFINITY);
    CHECK(fp16_to_f32(0xfc00) == -INFINITY);
    CHECK(isnan(fp16_to_f32(0x7e00)) && isnan(fp16_to_f32(0x7c01)));
    CHECK(fp16_to_f32(0x7bff) == 65504.0f);
}

TEST(fp16_all_halves_round_trip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        if (isnan(f)) {
            CHECKF(((h >> 10) & 0x1f) == 31 && (h & 0x3ff), "0x%04x decoded as NaN", h);
            continue;
        }
        CHECKF(f32_to_fp16(f) == h, "0x%04x -> %a -> 0x%04x", h, (double)f, f32_to_fp16(f));
    }
}

__attribute__((target("f16c"))) static uint16_t hw_f32_to_fp16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_fp16_to_f32(uint16_t h)
{
    return _cvtsh_ss(h);
}

TEST(fp16_matches_f16c)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) SKIP("CPU has no F16C");
    for (uint32_t h = 0; h < 65536; h++) {
        float a = fp16_to_f32((uint16_t)h), b = hw_fp16_to_f32((uint16_t)h);
        CHECKF(bits(a) == bits(b) || (isnan(a) && isnan(b)), "0x%04x: %a vs %a", h, (double)a,
               (double)b);
    }
    /* Every float whose exponent is in or near the half range, sampled, plus random bit
     * patterns over the whole range. */
    for (int i = 0; i < 4000000; i++) {
        uint32_t u = next_u32();
        if (i & 1) u = (u & 0x807fffff) | ((uint32_t)(96 + (u >> 23) % 48) << 23);
        float f = from_bits(u);
        if (isnan(f)) continue; /* F16C keeps NaN payloads; ggml writes 0x7e00 */
        CHECKF(f32_to_fp16(f) == hw_f32_to_fp16(f), "%a (0x%08x): 0x%04x vs F16C 0x%04x", (double)f,
               u, f32_to_fp16(f), hw_f32_to_fp16(f));
    }
}

TEST(bf16_edge_cases)
{
    CHECK_EQ_INT(f32_to_bf16(0.0f), 0x0000);
    CHECK_EQ_INT(f32_to_bf16(-0.0f), 0x8000);
    CHECK_EQ_INT(f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie: to even */
    CHECK_EQ_INT(f32_to_bf16(1.0f + 0x3p-8f), 0x3f82); /* tie: to even */
    CHECK_EQ_INT(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    CHECK_EQ_INT(f32_to_bf16(6.342e-5f), 0x3885);
    CHECK_EQ_INT(f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(f32_to_bf16(-INFINITY), 0xff80);
    CHECK_EQ_INT(f32_to_bf16(3.4028235e38f), 0x7f80); /* rounds up to infinity */
    CHECK_EQ_INT(f32_to_bf16(from_bits(0x7fc00001)), 0x7fc0);
    CHECK_EQ_INT(f32_to_bf16(from_bits(0x7f800001)), 0x7fc0); /* signalling NaN made quiet */
    CHECK_EQ_INT(f32_to_bf16(from_bits(0xffff0000)), 0xffff); /* NaN: no carry into the sign */
    CHECK_EQ_INT(f32_to_bf16(from_bits(0x00000001)), 0x0000); /* subnormals are kept, rounded */
    CHECK_EQ_INT(f32_to_bf16(from_bits(0x00018000)), 0x0002);
    CHECK(bf16_to_f32(0x3f80) == 1.0f);
    CHECK(bf16_to_f32(0x0001) == from_bits(0x00010000));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bf16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        CHECKF(f32_to_bf16(f) == h, "0x%04x", h);
    }
}

/* x[j] = j - 16: amax = 16, d = 16/127 (f16 0x3008), 1/d = 7.9375 exactly, and q = roundf(k *
 * 7.9375) with ties away from zero: k = +-8 gives +-63.5 -> +-64 (rint would give 64 too, but
 * -63.5 -> -64 only with roundf's ties-away). */
TEST(q8_0_known_block)
{
    static const int8_t want[32] = {-127, -119, -111, -103, -95, -87, -79, -71, -64, -56, -48,
                                    -40,  -32,  -24,  -16,  -8,  0,   8,   16,  24,  32,  40,
                                    48,   56,   64,   71,   79,  87,  95,  103, 111, 119};
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    struct block_q8_0 b;
    CHECK(quantize_row(GGML_Q8_0, x, &b, 32) == 0);
    CHECK_EQ_INT(b.d, 0x3008);
    for (int j = 0; j < 32; j++)
        CHECKF(b.qs[j] == want[j], "qs[%d] = %d, want %d", j, b.qs[j], want[j]);
    float y[32];
    CHECK(dequantize_row(GGML_Q8_0, &b, y, 32) == 0);
    for (int j = 0; j < 32; j++) CHECK(y[j] == want[j] * fp16_to_f32(0x3008));
    /* All zero: d = 0 and q = 0, no division by zero. */
    memset(x, 0, sizeof x);
    CHECK(quantize_row(GGML_Q8_0, x, &b, 32) == 0);
    CHECK_EQ_INT(b.d, 0);
    for (int j = 0; j < 32; j++) CHECK_EQ_INT(b.qs[j], 0);
}

/* x[j] = j - 16: the largest magnitude is -16, so d = -16/-8 = 2 (f16 0x4000), 1/d = 0.5 and
 * q = (int8)(x/2 + 8.5) = (int8)(j/2 + 0.5); j = 31 gives 16, clamped to 15. Low nibbles hold
 * j < 16, high nibbles j + 16. */
TEST(q4_0_known_block)
{
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    struct block_q4_0 b;
    CHECK(quantize_row(GGML_Q4_0, x, &b, 32) == 0);
    CHECK_EQ_INT(b.d, 0x4000);
    for (int j = 0; j < 16; j++) {
        int lo = (int)(j * 0.5 + 0.5);
        int hi = (int)((j + 16) * 0.5 + 0.5);
        if (hi > 15) hi = 15;
        CHECKF(b.qs[j] == (lo | hi << 4), "qs[%d] = 0x%02x, want 0x%02x", j, b.qs[j], lo | hi << 4);
    }
    CHECK_EQ_INT(b.qs[0], 0x80);
    CHECK_EQ_INT(b.qs[15], 0xf8);
    float y[32];
    CHECK(dequantize_row(GGML_Q4_0, &b, y, 32) == 0);
    CHECK(y[0] == -16.0f && y[1] == -14.0f && y[2] == -14.0f && y[31] == 14.0f);
    /* A positive extreme maps to -8 with a negative d. */
    for (int j = 0; j < 32; j++) x[j] = j == 5 ? 4.0f : 0.25f;
    CHECK(quantize_row(GGML_Q4_0, x, &b, 32) == 0);
    CHECK_EQ_INT(b.d, 0xb800); /* -0.5 */
    CHECK_EQ_INT(b.qs[5] & 0xf, 0);
    CHECK_EQ_INT(b.qs[0] & 0xf, 8); /* 0.25 * -2 + 8.5 = 8 */
}

/* A super-block whose sub-blocks are exact 4-bit ramps: x = (l % 16) - m_j with m_j = 8 for odd
 * j and 0 for even j. Every fit is exact (scale 1, min 0 or -8), so max_scale = 1, max_min = 8,
 * the 6-bit scales are all 63, the mins 63 (odd j) or 0 (even j); d = f16(1/63) = 0x2410,
 * dmin = f16(8/63) = 0x3010, and requantizing against the stored scales gives back l % 16. */
TEST(q4_K_known_block)
{
    float x[256];
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) x[32 * j + l] = (float)(l % 16) - (j & 1 ? 8.0f : 0.0f);
    struct block_q4_K b;
    CHECK(quantize_row(GGML_Q4_K, x, &b, 256) == 0);
    CHECK_EQ_INT(b.d, 0x2410);
    CHECK_EQ_INT(b.dmin, 0x3010);
    static const uint8_t scales[12] = {0xff, 0xff, 0xff, 0xff, 0x00, 0xff,
                                       0x00, 0xff, 0x0f, 0xff, 0x0f, 0xff};
    for (int i = 0; i < 12; i++)
        CHECKF(b.scales[i] == scales[i], "scales[%d] = 0x%02x, want 0x%02x", i, b.scales[i],
               scales[i]);
    for (int i = 0; i < 128; i++) CHECK_EQ_INT(b.qs[i], (i % 16) | (i % 16) << 4);
    float y[256];
    CHECK(dequantize_row(GGML_Q4_K, &b, y, 256) == 0);
    for (int i = 0; i < 256; i++)
        CHECKF(fabsf(y[i] - x[i]) < 0.005f, "y[%d] = %g, x = %g", i, y[i], x[i]);
}

/* Random rows: the reconstruction error per element stays within what the format allows. */
TEST(round_trip_error_bounds)
{
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t buf[N * 4];
    for (int i = 0; i < N; i++) x[i] = uniform() * (i % 512 < 256 ? 1.0f : 30.0f);
    /* F32 exact; F16/BF16 within half an ulp of their mantissa (2^-11, 2^-8 relative). */
    CHECK(quantize_row(GGML_F32, x, buf, N) == 0 && dequantize_row(GGML_F32, buf, y, N) == 0);
    CHECK(memcmp(x, y, sizeof x) == 0);
    CHECK(quantize_row(GGML_F16, x, buf, N) == 0 && dequantize_row(GGML_F16, buf, y, N) == 0);
    for (int i = 0; i < N; i++) CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f + 0x1p-25f);
    CHECK(quantize_row(GGML_BF16, x, buf, N) == 0 && dequantize_row(GGML_BF16, buf, y, N) == 0);
    for (int i = 0; i < N; i++) CHECK(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    /* Q8_0: half a step d = amax/127, plus |q| <= 127 times the f16 rounding of d (2^-11 d). */
    CHECK(quantize_row(GGML_Q8_0, x, buf, N) == 0 && dequantize_row(GGML_Q8_0, buf, y, N) == 0);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        float d = amax / 127;
        for (int j = 0; j < 32; j++) CHECK(fabsf(y[32 * b + j] - x[32 * b + j]) <= 0.57f * d);
    }
    /* Q4_0: one step d = amax/8 at the clamped end (+7 cannot reach +8), half a step elsewhere. */
    CHECK(quantize_row(GGML_Q4_0, x, buf, N) == 0 && dequantize_row(GGML_Q4_0, buf, y, N) == 0);
    for (int b = 0; b < N / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        for (int j = 0; j < 32; j++)
            CHECK(fabsf(y[32 * b + j] - x[32 * b + j]) <= 1.01f * amax / 8);
    }
    /* Q4_K: each sub-block spans its range in 15 steps, but the 6-bit scales and mins lose up to
     * 1/126 of the super-block maximum each: bound by a step of the largest sub-block range. */
    CHECK(quantize_row(GGML_Q4_K, x, buf, N) == 0 && dequantize_row(GGML_Q4_K, buf, y, N) == 0);
    double se = 0, sx = 0;
    for (int s = 0; s < N / 256; s++) {
        float lo = 0, hi = 0;
        for (int j = 0; j < 256; j++) {
            lo = fminf(lo, x[256 * s + j]);
            hi = fmaxf(hi, x[256 * s + j]);
        }
        for (int j = 0; j < 256; j++) {
            float e = fabsf(y[256 * s + j] - x[256 * s + j]);
            CHECKF(e <= (hi - lo) / 15, "super-block %d elem %d: error %g range %g", s, j, e,
                   hi - lo);
            se += (double)e * e;
            sx += (double)x[256 * s + j] * x[256 * s + j];
        }
    }
    CHECKF(se / sx < 0.01, "Q4_K relative squared error %g", se / sx);
}

/* Hand-built blocks of every other type, a few elements each worked out from ggml's formula
 * (quant.h): the fields at the places ggml puts them. */
TEST(dequant_hand_built_blocks)
{
    float y[256];
    /* Q4_1: x = d*q + m; byte 3 holds elements 3 (low) and 19 (high) */
    struct block_q4_1 b41 = {0x3c00, 0xbc00, {0}}; /* d 1, m -1 */
    b41.qs[3] = 0xa5;
    CHECK(dequantize_row(GGML_Q4_1, &b41, y, 32) == 0);
    CHECK(y[3] == 4.0f && y[19] == 9.0f && y[0] == -1.0f);
    /* Q5_0: x = d*(q-16), the 5th bit of element e is bit e of qh */
    struct block_q5_0 b50 = {0x4000, {0}, {0}}; /* d 2 */
    uint32_t qh = 1u << 3 | 1u << 19;
    memcpy(b50.qh, &qh, 4);
    b50.qs[3] = 0x21;
    CHECK(dequantize_row(GGML_Q5_0, &b50, y, 32) == 0);
    CHECK(y[3] == 2.0f && y[19] == 4.0f && y[4] == -32.0f);
    /* Q5_1: x = d*q + m */
    struct block_q5_1 b51 = {0x3800, 0x3c00, {0}, {0}}; /* d 0.5, m 1 */
    memcpy(b51.qh, &qh, 4);
    b51.qs[3] = 0x21;
    CHECK(dequantize_row(GGML_Q5_1, &b51, y, 32) == 0);
    CHECK(y[3] == 9.5f && y[19] == 10.0f && y[4] == 1.0f);
    /* IQ4_NL: x = d*kvalues[nibble] */
    struct block_iq4_nl bnl = {0x3c00, {0}};
    bnl.qs[0] = 0xf0;
    CHECK(dequantize_row(GGML_IQ4_NL, &bnl, y, 32) == 0);
    CHECK(y[0] == -127.0f && y[16] == 113.0f && y[1] == -127.0f);
    /* Q2_K: element 37 = 128*0 + 32*1 + 5: bits 2-3 of qs[5], sub-block 2 (scales[2] = sc | m<<4);
     * element 165 = 128 + 32 + 5: bits 2-3 of qs[37], sub-block 10 */
    struct block_q2_K b2;
    memset(&b2, 0, sizeof b2);
    b2.d = 0x3c00, b2.dmin = 0x3800; /* 1, 0.5 */
    b2.scales[2] = 0x53, b2.scales[10] = 0x21;
    b2.qs[5] = 0x0c, b2.qs[37] = 0x04;
    CHECK(dequantize_row(GGML_Q2_K, &b2, y, 256) == 0);
    CHECK(y[37] == 6.5f && y[165] == 0.0f && y[32] == -2.5f);
    /* Q3_K: sub-block 2's scale = low nibble of scales[2] | bits 0-1 of scales[10] << 4 = 37
     * (minus 32: 5); element 37's q = bits 2-3 of qs[5] | bit 1 of hmask[5] << 2, minus 4 */
    struct block_q3_K b3;
    memset(&b3, 0, sizeof b3);
    b3.d = 0x3c00;
    b3.scales[2] = 0x05, b3.scales[10] = 0x02;
    b3.qs[5] = 0x0c, b3.hmask[5] = 0x02;
    b3.qs[6] = 0x0c; /* element 38: hmask bit clear, 3 - 4 */
    CHECK(dequantize_row(GGML_Q3_K, &b3, y, 256) == 0);
    CHECK(q3_K_scale(2, b3.scales) == 37);
    CHECK(y[37] == 15.0f && y[38] == -5.0f && y[32] == -20.0f);
    /* Q5_K: element 40 = sub-block 1 (high nibble of qs[8] in group 0), 5th bit = bit 1 of qh[8];
     * sub-block 1's scale and min are bytes 1 and 5 */
    struct block_q5_K b5;
    memset(&b5, 0, sizeof b5);
    b5.d = 0x3c00, b5.dmin = 0x3800;
    b5.scales[1] = 2, b5.scales[5] = 3;
    b5.qs[8] = 0x70, b5.qh[8] = 0x02;
    CHECK(dequantize_row(GGML_Q5_K, &b5, y, 256) == 0);
    CHECK(y[40] == 44.5f && y[41] == -1.5f && y[0] == 0.0f);
    /* Q6_K: element 195 = 128 + 64 + 3: high nibble of ql[64 + 3], bits 4-5 of qh[32 + 3],
     * scale 195 / 16 = 12 */
    struct block_q6_K b6;
    memset(&b6, 0, sizeof b6);
    b6.d = 0x3c00;
    b6.scales[12] = -3;
    b6.ql[67] = 0xa0, b6.qh[35] = 0x20;
    CHECK(dequantize_row(GGML_Q6_K, &b6, y, 256) == 0);
    CHECK(y[195] == -30.0f && y[194] == 96.0f && y[0] == 0.0f);
    /* IQ4_XS: sub-block 3's scale = high nibble of scales_l[1] | bits 6-7 of scales_h << 4 = 37
     * (minus 32: 5); element 114 = 96 + 16 + 2: high nibble of qs[48 + 2] */
    struct block_iq4_xs bx;
    memset(&bx, 0, sizeof bx);
    bx.d = 0x3c00;
    bx.scales_l[1] = 0x50, bx.scales_h = 2 << 6;
    bx.qs[50] = 0xf0;
    CHECK(dequantize_row(GGML_IQ4_XS, &bx, y, 256) == 0);
    CHECK(iq4_xs_scale(3, &bx) == 37);
    CHECK(y[114] == 565.0f && y[98] == -635.0f && y[0] == 4064.0f); /* sub-block 0: (0-32)*-127 */
}

/* Every type: dequantize(quantize(x)) stays close to x (relative squared error per type, a
 * generous multiple of what the format gives on uniform noise). */
TEST(round_trip_every_type)
{
    static const struct {
        uint32_t type;
        double max_rel;
    } t[] = {{GGML_Q4_1, 0.01},  {GGML_Q5_0, 0.003}, {GGML_Q5_1, 0.003}, {GGML_IQ4_NL, 0.02},
             {GGML_Q2_K, 0.15},  {GGML_Q3_K, 0.05},  {GGML_Q4_K, 0.01},  {GGML_Q5_K, 0.003},
             {GGML_Q6_K, 0.001}, {GGML_IQ4_XS, 0.02}};
    enum { N = 2048 };
    static float x[N], y[N];
    static uint8_t buf[N * 2];
    for (int i = 0; i < N; i++) x[i] = uniform() * (i % 512 < 256 ? 1.0f : 30.0f);
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        CHECK(quantize_row(t[k].type, x, buf, N) == 0 && dequantize_row(t[k].type, buf, y, N) == 0);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++)
            se += (double)(y[i] - x[i]) * (y[i] - x[i]), sx += (double)x[i] * x[i];
        CHECKF(se / sx < t[k].max_rel, "%s: relative squared error %.3g", ggml_type_name(t[k].type),
               se / sx);
    }
}

TEST(bad_arguments)
{
    float x[64] = {0};
    uint8_t buf[512];
    CHECK(quantize_row(GGML_Q8_0, x, buf, 33) == -1);
    CHECK(quantize_row(GGML_Q4_K, x, buf, 64) == -1);
    CHECK(quantize_row(9, x, buf, 32) == -1); /* Q8_1: an activation format only */
    CHECK(dequantize_row(99, buf, x, 32) == -1);
    CHECK(dequantize_row(GGML_Q4_0, buf, x, 31) == -1);
}

int main(void)
{
    RUN(fp16_edge_cases);
    RUN(fp16_all_halves_round_trip);
    RUN(fp16_matches_f16c);
    RUN(bf16_edge_cases);
    RUN(q8_0_known_block);
    RUN(q4_0_known_block);
    RUN(q4_K_known_block);
    RUN(round_trip_error_bounds);
    RUN(dequant_hand_built_blocks);
    RUN(round_trip_every_type);
    RUN(bad_arguments);
    CHECK_DONE();
}
