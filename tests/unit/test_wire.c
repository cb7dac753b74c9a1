/* Wire format: CRC-32C vectors, IEEE-754 and half-precision bit patterns, every encoder against
 * its decoder, and every decoder against short, long and corrupted input. */
#include "os/common/errmsg.h"
#include "tests/unit/check.h"
#include "transport/crc32c.h"
#include "transport/wire.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>

static char err[ERRMSG_LEN];

TEST(crc32c_vectors)
{
    /* RFC 3720 (iSCSI) B.4 and the common check value. */
    uint8_t b[32];
    CHECK_EQ_INT(crc32c(0, "123456789", 9), 0xE3069283u);
    memset(b, 0, 32);
    CHECK_EQ_INT(crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, 32);
    CHECK_EQ_INT(crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    CHECK_EQ_INT(crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    CHECK_EQ_INT(crc32c(0, b, 32), 0x113FDB5Cu);
    CHECK_EQ_INT(crc32c(0, b, 0), 0);
    CHECK_EQ_INT(crc32c_sw(0, "123456789", 9), 0xE3069283u);
}

TEST(crc32c_hw_matches_table_and_chains)
{
    static uint8_t buf[4096 + 16];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < sizeof buf; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)x;
    }
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len < 300; len += 7)
            CHECK_EQ_INT(crc32c(0, buf + off, len), crc32c_sw(0, buf + off, len));
    uint32_t whole = crc32c(0, buf, 4096);
    CHECK_EQ_INT(crc32c(crc32c(0, buf, 1000), buf + 1000, 3096), whole);
    CHECK_EQ_INT(crc32c_sw(crc32c_sw(0, buf, 13), buf + 13, 4083), whole);
}

TEST(ieee754_f32_bits)
{
    uint8_t out[4];
    struct wire_w w = {out, 4, 0, 0};
    CHECK_EQ_INT(wire_f32_bits(6.342e-5f), 0x3885005Au);
    wire_put_f32(&w, 6.342e-5f);
    CHECK(!w.bad && w.off == 4);
    /* Little-endian on the wire: the big-endian bytes 38 85 00 5A reversed. */
    CHECK(out[0] == 0x5A && out[1] == 0x00 && out[2] == 0x85 && out[3] == 0x38);
    struct wire_r r = {out, 4, 0, 0};
    CHECK(wire_get_f32(&r) == 6.342e-5f);
    CHECK_EQ_INT(wire_f32_bits(1.0f), 0x3F800000u);
    CHECK_EQ_INT(wire_f32_bits(-2.0f), 0xC0000000u);
    CHECK_EQ_INT(wire_f32_bits(INFINITY), 0x7F800000u);
    CHECK_EQ_INT(wire_f32_bits(-0.0f), 0x80000000u);
    CHECK(isnan(wire_bits_f32(0x7FC00000u)));
}

/* Reference half and bfloat16 decoding, to pin the bit patterns the fabric ships. */
static double half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

TEST(fp16_bf16_patterns)
{
    CHECK(half_value(0x3C00) == 1.0);
    CHECK(half_value(0xC000) == -2.0);
    CHECK(half_value(0x7BFF) == 65504.0);
    CHECK(half_value(0x0001) == ldexp(1, -24));
    CHECK(isinf(half_value(0x7C00)));
    /* 6.342e-5 as fp16 is 0x0428 (1.0390625 * 2^-14 = 6.3419e-5). */
    CHECK(fabs(half_value(0x0428) - 6.342e-5) < 1e-8);
    /* bf16 is the upper half of the f32: 6.342e-5 -> 0x3885 (round to nearest even). */
    CHECK_EQ_INT(wire_f32_bits(6.342e-5f) >> 16, 0x3885);
    uint8_t out[4];
    struct wire_w w = {out, 4, 0, 0};
    wire_put_u16(&w, 0x0428);
    wire_put_u16(&w, 0x3885);
    CHECK(out[0] == 0x28 && out[1] == 0x04 && out[2] == 0x85 && out[3] == 0x38);
    struct wire_r r = {out, 4, 0, 0};
    CHECK_EQ_INT(wire_get_u16(&r), 0x0428);
    CHECK_EQ_INT(wire_get_u16(&r), 0x3885);
    CHECK(!r.bad);
    CHECK_EQ_INT(wire_get_u16(&r), 0);
    CHECK(r.bad);
}

TEST(header_roundtrip_and_bytes)
{
    struct wire_hdr h = {WIRE_VERSION, WIRE_MSG, WIRE_F_END, 3, 7, 0x0102030405060708ull, 0};
    uint8_t f[WIRE_HDR_LEN + 3] = {0};
    memcpy(f + WIRE_HDR_LEN, "abc", 3);
    h.crc = crc32c(0, "abc", 3);
    wire_hdr_encode(f, &h);
    static const uint8_t head[] = {0x53, 0x54, 0x52, 0x41, 1, 3, 1, 0, 3, 0, 0, 0,
                                   7,    0,    0,    0,    8, 7, 6, 5, 4, 3, 2, 1};
    CHECK(!memcmp(f, head, sizeof head));
    struct wire_hdr g;
    CHECK(wire_frame_check(&g, f, sizeof f, err) == 0);
    CHECK(g.type == WIRE_MSG && g.flags == WIRE_F_END && g.length == 3 && g.conn == 7 &&
          g.seq == 0x0102030405060708ull && g.crc == h.crc);
    for (size_t n = 0; n < sizeof f; n++) CHECK(wire_frame_check(&g, f, n, err) == -1);
    uint8_t longer[sizeof f + 1];
    memcpy(longer, f, sizeof f);
    CHECK(wire_frame_check(&g, longer, sizeof longer, err) == -1);
    /* Any flipped bit in any field or in the payload is rejected. */
    for (size_t i = 0; i < sizeof f; i++)
        for (int b = 0; b < 8; b++) {
            /* type, flags, conn and seq are authenticated by the session (test_fabric_auth) */
            if ((i >= 5 && i < 8) || (i >= 12 && i < 24)) continue;
            uint8_t c[sizeof f];
            memcpy(c, f, sizeof f);
            c[i] ^= (uint8_t)(1 << b);
            CHECKF(wire_frame_check(&g, c, sizeof c, err) == -1, "byte %zu bit %d", i, b);
        }
    /* Types 1..7 exist (6, 7: the control plane's HELLO_ID and HELLO_ID_ACK), 0 and 8.. not. */
    for (int t = 0; t < 10; t++) {
        h.type = (uint8_t)t;
        wire_hdr_encode(f, &h);
        CHECKF(wire_hdr_decode(&g, f, sizeof f, err) == (t >= 1 && t <= 7 ? 0 : -1), "type %d", t);
    }
    h.type = WIRE_MSG;
    h.length = WIRE_MAX_FRAME;
    wire_hdr_encode(f, &h);
    CHECK(wire_hdr_peek(&g, f, sizeof f, err) == -1);
}

/* Round trip, then every truncation and one extra byte must be rejected. */
#define CHECK_STRICT(decode_call_len)                                                              \
    do {                                                                                           \
        for (size_t n_ = 0; n_ < len; n_++) {                                                      \
            size_t L = n_;                                                                         \
            CHECKF((decode_call_len) == -1, "accepted %zu of %zu bytes", n_, len);                 \
        }                                                                                          \
        buf[len] = 0;                                                                              \
        size_t L = len + 1;                                                                        \
        CHECKF((decode_call_len) == -1, "accepted a trailing byte");                               \
    } while (0)

TEST(manifest_roundtrip_and_rejects)
{
    static struct wire_manifest m, d;
    static uint8_t buf[65536];
    memset(&m, 0, sizeof m);
    for (int i = 0; i < WIRE_ID_LEN; i++) m.model_id[i] = (uint8_t)(i * 7);
    strcpy(m.name, "stories15M");
    m.header_len = 12345;
    m.header_crc = 0xdeadbeef;
    m.image_size = 1000;
    m.chunk_size = 4096;
    m.n_spans = 3;
    m.span[0] = (struct wire_span){0, 100, 1};
    m.span[1] = (struct wire_span){128, 500, 2};
    m.span[2] = (struct wire_span){640, 360, 3};
    size_t len = wire_manifest_encode(buf, sizeof buf, &m);
    CHECK(len > 0);
    CHECK(wire_manifest_decode(&d, buf, len, err) == 0);
    CHECK(!memcmp(d.model_id, m.model_id, WIRE_ID_LEN));
    CHECK_STR(d.name, "stories15M");
    CHECK(d.header_len == 12345 && d.header_crc == 0xdeadbeef && d.image_size == 1000 &&
          d.chunk_size == 4096 && d.n_spans == 3 && d.span[1].offset == 128 &&
          d.span[2].size == 360 && d.span[2].crc == 3);
    CHECK_STRICT(wire_manifest_decode(&d, buf, L, err));
    CHECK(wire_manifest_encode(buf, len - 1, &m) == 0);

    struct wire_manifest bad = m;
    bad.span[1].offset = 50; /* overlaps span 0 */
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    bad = m;
    bad.span[2].size = 361; /* past the image */
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    bad = m;
    bad.chunk_size = 16;
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    bad = m;
    bad.n_spans = 0;
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    bad = m;
    bad.header_len = (uint64_t)WIRE_MAX_HEADER_BYTES + 1;
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    bad = m;
    strcpy(bad.name, "bad\nname");
    len = wire_manifest_encode(buf, sizeof buf, &bad);
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    /* A span count that claims more than the bytes hold. */
    len = wire_manifest_encode(buf, sizeof buf, &m);
    buf[1 + WIRE_ID_LEN + 1 + 10 + 8 + 4 + 8 + 4] = 200;
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
    /* Wrong message type. */
    len = wire_manifest_encode(buf, sizeof buf, &m);
    buf[0] = MSG_JOIN;
    CHECK(wire_manifest_decode(&d, buf, len, err) == -1);
}

TEST(join_roundtrip_and_rejects)
{
    static struct wire_join j, d;
    uint8_t buf[1024];
    memset(&j, 0, sizeof j);
    j.model_id[0] = 9;
    j.flags = JOIN_HAVE_HEADER;
    j.chunk_size = 65536;
    j.n_spans = 13;
    j.have[0] = 0xA5;
    j.have[1] = 0x11;
    size_t len = wire_join_encode(buf, sizeof buf, &j);
    CHECK(len == 1 + WIRE_ID_LEN + 1 + 4 + 4 + 2);
    CHECK(wire_join_decode(&d, buf, len, err) == 0);
    CHECK(d.model_id[0] == 9 && d.flags == JOIN_HAVE_HEADER && d.chunk_size == 65536 &&
          d.n_spans == 13 && d.have[0] == 0xA5 && d.have[1] == 0x11);
    CHECK_STRICT(wire_join_decode(&d, buf, L, err));
    j.have[1] = 0x21; /* bit 13 is past n_spans */
    len = wire_join_encode(buf, sizeof buf, &j);
    CHECK(wire_join_decode(&d, buf, len, err) == -1);
    j.have[1] = 0x11;
    j.flags = 0x80;
    len = wire_join_encode(buf, sizeof buf, &j);
    CHECK(wire_join_decode(&d, buf, len, err) == -1);
    j.flags = 0;
    j.chunk_size = 3;
    len = wire_join_encode(buf, sizeof buf, &j);
    CHECK(wire_join_decode(&d, buf, len, err) == -1);
    j.chunk_size = 0;
    j.n_spans = WIRE_MAX_SPANS + 1;
    CHECK(wire_join_encode(buf, sizeof buf, &j) == 0);
}

TEST(chunk_roundtrip_and_rejects)
{
    static uint8_t buf[4096];
    uint8_t data[100];
    for (int i = 0; i < 100; i++) data[i] = (uint8_t)(i * 3);
    struct wire_chunk c = {REGION_IMAGE, 4, 1 << 20, 100, crc32c(0, data, 100), data}, d;
    size_t len = wire_chunk_encode(buf, sizeof buf, &c);
    CHECK(len == WIRE_CHUNK_HDR_LEN + 100);
    CHECK(wire_chunk_decode(&d, buf, len, err) == 0);
    CHECK(d.region == REGION_IMAGE && d.span == 4 && d.offset == 1 << 20 && d.len == 100 &&
          !memcmp(d.data, data, 100) && d.data == buf + WIRE_CHUNK_HDR_LEN);
    CHECK_STRICT(wire_chunk_decode(&d, buf, L, err));
    buf[WIRE_CHUNK_HDR_LEN + 50] ^= 1; /* a corrupted byte fails the chunk CRC */
    CHECK(wire_chunk_decode(&d, buf, len, err) == -1);
    buf[WIRE_CHUNK_HDR_LEN + 50] ^= 1;
    buf[1] = 7; /* unknown region */
    CHECK(wire_chunk_decode(&d, buf, len, err) == -1);
}

TEST(small_messages)
{
    uint8_t buf[256];
    size_t len = wire_refetch_encode(buf, sizeof buf, 42);
    uint32_t u = 0;
    CHECK(wire_refetch_decode(&u, buf, len, err) == 0 && u == 42);
    CHECK_STRICT(wire_refetch_decode(&u, buf, L, err));
    len = wire_refetch_encode(buf, sizeof buf, WIRE_MAX_SPANS);
    CHECK(wire_refetch_decode(&u, buf, len, err) == -1);
    len = wire_done_encode(buf, sizeof buf);
    CHECK(len == 1 && wire_done_decode(buf, len, err) == 0);
    CHECK_STRICT(wire_done_decode(buf, L, err));

    struct wire_ack a = {.cum = 77}, b;
    a.sack[0] = 0x5;
    a.sack[WIRE_SACK_WORDS - 1] = 1ull << 63;
    len = wire_ack_encode(buf, sizeof buf, &a);
    CHECK(len == WIRE_ACK_LEN);
    CHECK(wire_ack_decode(&b, buf, len, err) == 0 && !memcmp(&a, &b, sizeof a));
    CHECK_STRICT(wire_ack_decode(&b, buf, L, err));

    struct wire_rdma_info i = {.qpn = 0x123456,
                               .psn = 0xabcdef,
                               .lid = 3,
                               .rkey = 99,
                               .addr = 0x7f0000001000ull,
                               .len = 1 << 20},
                          o;
    i.gid[15] = 1;
    len = wire_rdma_info_encode(buf, sizeof buf, &i);
    CHECK(len == WIRE_RDMA_INFO_LEN);
    CHECK(wire_rdma_info_decode(&o, buf, len, err) == 0);
    CHECK(o.qpn == i.qpn && o.psn == i.psn && o.lid == i.lid && o.rkey == i.rkey &&
          o.addr == i.addr && o.len == i.len && !memcmp(o.gid, i.gid, 16));
    CHECK_STRICT(wire_rdma_info_decode(&o, buf, L, err));
    i.qpn = 1u << 24;
    len = wire_rdma_info_encode(buf, sizeof buf, &i);
    CHECK(wire_rdma_info_decode(&o, buf, len, err) == -1);
    CHECK(wire_msg_type(buf, 0) == -1);
}

TEST(activations_f32_f16_bf16)
{
    /* Three rows of dim 2 with values whose encodings are pinned. */
    const uint32_t seq[3] = {7, 7, 9}, pos[3] = {0, 1, 41}, tok[3] = {1, 300, 511};
    const uint8_t fl[3] = {0, WIRE_ROW_LOGITS, WIRE_ROW_LOGITS | WIRE_ROW_MASK_EOS};
    const float x[6] = {6.342e-5f, 1.0f, -2.0f, 65504.0f, 0.0f, -0.5f};
    struct wire_activations a = {.step = 12,
                                 .layer = 3,
                                 .n = 3,
                                 .dim = 2,
                                 .seq = seq,
                                 .pos = pos,
                                 .token = tok,
                                 .flags = fl,
                                 .x = x};
    static uint8_t buf[256];
    uint32_t dseq[3], dpos[3], dtok[3];
    uint8_t dfl[3];
    float dx[6];
    struct wire_activations d;
    const size_t rows = 3 * WIRE_ACT_ROW_LEN;
#define DEC(L, capn, capx)                                                                         \
    wire_activations_decode(&d, buf, (L), dseq, dpos, dtok, dfl, dx, (capn), (capx), err)
    /* f32: the exact bits; 6.342e-5 is 0x3885005A (bytes 5A 00 85 38 on the wire). */
    a.dtype = WIRE_F32;
    size_t len = wire_activations_encode(buf, sizeof buf, &a);
    CHECK(len == wire_activations_size(3, 2, WIRE_F32) && len == WIRE_ACT_HDR_LEN + rows + 24 + 4);
    const uint8_t *v = buf + WIRE_ACT_HDR_LEN + rows;
    CHECK(v[0] == 0x5A && v[1] == 0x00 && v[2] == 0x85 && v[3] == 0x38);
    /* the row of sequence 9: 09 00 00 00 | 29 00 00 00 | FF 01 00 00 | 03 */
    const uint8_t *r2 = buf + WIRE_ACT_HDR_LEN + 2 * WIRE_ACT_ROW_LEN;
    CHECK(r2[0] == 9 && r2[4] == 41 && r2[8] == 0xFF && r2[9] == 1 && r2[12] == 3);
    CHECK(DEC(len, 3, 6) == 0);
    CHECK(d.step == 12 && d.layer == 3 && d.n == 3 && d.dim == 2 && dseq[2] == 9 && dpos[2] == 41);
    CHECK(dtok[1] == 300 && dfl[0] == 0 && dfl[2] == (WIRE_ROW_LOGITS | WIRE_ROW_MASK_EOS));
    CHECK(!memcmp(dx, x, sizeof x));
    CHECK_STRICT(DEC(L, 3, 6));
    CHECK(DEC(len, 2, 6) == -1); /* no room for the rows */
    CHECK(DEC(len, 3, 5) == -1); /* no room for the values */
    /* any flipped bit fails the CRC */
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x10;
        CHECKF(DEC(len, 3, 6) == -1, "byte %zu flipped was accepted", i);
        buf[i] ^= 0x10;
    }
    /* fp16: 6.342e-5 -> 0x0428, 1.0 -> 0x3C00, -2 -> 0xC000, 65504 -> 0x7BFF. */
    a.dtype = WIRE_F16;
    len = wire_activations_encode(buf, sizeof buf, &a);
    CHECK(len == WIRE_ACT_HDR_LEN + rows + 12 + 4);
    v = buf + WIRE_ACT_HDR_LEN + rows;
    CHECK(v[0] == 0x28 && v[1] == 0x04 && v[2] == 0x00 && v[3] == 0x3C && v[4] == 0x00 &&
          v[5] == 0xC0 && v[6] == 0xFF && v[7] == 0x7B);
    CHECK(DEC(len, 3, 6) == 0);
    CHECK(fabs(dx[0] - 6.342e-5f) < 1e-8 && dx[1] == 1.0f && dx[2] == -2.0f && dx[3] == 65504.0f &&
          dx[5] == -0.5f);
    CHECK_STRICT(DEC(L, 3, 6));
    /* bf16: the upper half of the f32 (6.342e-5 -> 0x3885, 1.0 -> 0x3F80). */
    a.dtype = WIRE_BF16;
    len = wire_activations_encode(buf, sizeof buf, &a);
    v = buf + WIRE_ACT_HDR_LEN + rows;
    CHECK(v[0] == 0x85 && v[1] == 0x38 && v[2] == 0x80 && v[3] == 0x3F);
    CHECK(DEC(len, 3, 6) == 0);
    CHECK(dx[1] == 1.0f && dx[2] == -2.0f && fabs(dx[0] - 6.342e-5f) < 1e-6);
    /* Unknown dtype (even with a CRC that matches), unknown row flags, zero dim. */
    a.dtype = 5;
    CHECK(wire_activations_encode(buf, sizeof buf, &a) == 0);
    a.dtype = WIRE_F32;
    const uint8_t bad_fl[3] = {0, 4, 1};
    a.flags = bad_fl;
    len = wire_activations_encode(buf, sizeof buf, &a);
    CHECK(DEC(len, 3, 6) == -1);
    a.flags = fl;
    a.dim = 0;
    a.n = 0;
    len = wire_activations_encode(buf, sizeof buf, &a);
    CHECK(DEC(len, 3, 6) == -1);
    /* A message never exceeds WIRE_MAX_MSG at the row count max_rows allows. */
    CHECK(wire_activations_size(wire_activations_max_rows(4096, WIRE_F32), 4096, WIRE_F32) <=
          WIRE_MAX_MSG);
    CHECK(wire_activations_size(wire_activations_max_rows(4096, WIRE_F32) + 1, 4096, WIRE_F32) >
          WIRE_MAX_MSG);
    CHECK(wire_activations_max_rows(64, WIRE_F16) == WIRE_MAX_ACT_TOKENS);
#undef DEC
}

TEST(activations_token_rows)
{
    /* A joiner without its embedding sends token ids only: header and rows, no values. */
    const uint32_t seq[2] = {4, 5}, pos[2] = {0, 17}, tok[2] = {1, 31999};
    const uint8_t fl[2] = {0, WIRE_ROW_LOGITS};
    struct wire_activations a = {.step = 3,
                                 .layer = 0,
                                 .n = 2,
                                 .dim = 2048,
                                 .dtype = WIRE_TOKENS,
                                 .seq = seq,
                                 .pos = pos,
                                 .token = tok,
                                 .flags = fl};
    static uint8_t buf[256];
    uint32_t dseq[2], dpos[2], dtok[2];
    uint8_t dfl[2];
    float dx[1];
    struct wire_activations d;
#define DEC(L, capn, capx)                                                                         \
    wire_activations_decode(&d, buf, (L), dseq, dpos, dtok, dfl, dx, (capn), (capx), err)
    size_t len = wire_activations_encode(buf, sizeof buf, &a);
    CHECK(len == wire_activations_size(2, 2048, WIRE_TOKENS) &&
          len == WIRE_ACT_HDR_LEN + 2 * WIRE_ACT_ROW_LEN + 4);
    CHECK(buf[WIRE_ACT_HDR_LEN - 1] == WIRE_TOKENS);
    /* the second row: 05 00 00 00 | 11 00 00 00 | FF 7C 00 00 | 01, then the CRC */
    const uint8_t *r1 = buf + WIRE_ACT_HDR_LEN + WIRE_ACT_ROW_LEN;
    CHECK(r1[0] == 5 && r1[4] == 17 && r1[8] == 0xFF && r1[9] == 0x7C && r1[12] == 1);
    /* no room for values is needed: cap_x 0 decodes */
    CHECK(DEC(len, 2, 0) == 0);
    CHECK(d.dtype == WIRE_TOKENS && d.layer == 0 && d.n == 2 && d.dim == 2048);
    CHECK(dseq[1] == 5 && dpos[1] == 17 && dtok[1] == 31999 && dfl[1] == WIRE_ROW_LOGITS);
    CHECK_STRICT(DEC(L, 2, 0));
    CHECK(DEC(len, 1, 0) == -1); /* no room for the rows */
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x01;
        CHECKF(DEC(len, 2, 0) == -1, "byte %zu flipped was accepted", i);
        buf[i] ^= 0x01;
    }
    /* values after the rows: not the declared shape */
    CHECK(DEC(len + 4, 2, 0) == -1);
    /* token rows enter at layer 0 only: the encoder refuses, and a forged message with a
     * matching CRC is refused by the decoder */
    a.layer = 1;
    CHECK(wire_activations_encode(buf, sizeof buf, &a) == 0);
    a.layer = 0;
    len = wire_activations_encode(buf, sizeof buf, &a);
    buf[9] = 1; /* layer, byte 0 */
    uint32_t crc = crc32c(0, buf, len - 4);
    for (int i = 0; i < 4; i++) buf[len - 4 + i] = (uint8_t)(crc >> (8 * i));
    CHECK(DEC(len, 2, 0) == -1 && strstr(err, "layer 1"));
    /* rows per message: header and rows only */
    CHECK(wire_activations_max_rows(2048, WIRE_TOKENS) == WIRE_MAX_ACT_TOKENS);
    CHECK(wire_activations_max_rows(2048, WIRE_TOKENS) >=
          wire_activations_max_rows(2048, WIRE_F32));
#undef DEC
}

TEST(coop_tokens_open_close)
{
    static uint8_t buf[512];
    struct wire_coop_token tk[2] = {{7, 300, 0x0102030405060708ull}, {9, 2, 1}}, dt[2];
    struct wire_coop_tokens t = {.step = 5, .n = 2, .tok = tk}, d;
    size_t len = wire_coop_tokens_encode(buf, sizeof buf, &t);
    CHECK(len == 1 + 8 + 1 + 4 + 2 * 16 + 2 + 4);
    CHECK(buf[0] == MSG_COOP_TOKENS && buf[1] == 5 && buf[14] == 7 && buf[18] == 0x2c &&
          buf[19] == 0x01 && buf[22] == 0x08 && buf[29] == 0x01);
    CHECK(wire_coop_tokens_decode(&d, buf, len, dt, 2, err) == 0);
    CHECK(d.step == 5 && d.status == 0 && d.n == 2 && dt[0].token == 300 &&
          dt[0].rng == 0x0102030405060708ull && dt[1].seq == 9);
    CHECK_STRICT(wire_coop_tokens_decode(&d, buf, L, dt, 2, err));
    CHECK(wire_coop_tokens_decode(&d, buf, len, dt, 1, err) == -1);
    buf[3] ^= 1;
    CHECK(wire_coop_tokens_decode(&d, buf, len, dt, 2, err) == -1); /* CRC */
    /* An error reply carries its message and no tokens. */
    struct wire_coop_tokens e = {.step = 6, .status = 1};
    snprintf(e.error, sizeof e.error, "helper: out of KV blocks");
    len = wire_coop_tokens_encode(buf, sizeof buf, &e);
    CHECK(wire_coop_tokens_decode(&d, buf, len, dt, 2, err) == 0);
    CHECK(d.status == 1 && d.n == 0 && !strcmp(d.error, "helper: out of KV blocks"));
    CHECK_STRICT(wire_coop_tokens_decode(&d, buf, L, dt, 2, err));
    e.n = 1;
    CHECK(wire_coop_tokens_encode(buf, sizeof buf, &e) == 0);
    /* A refusal (no KV blocks at the helper: send it again) likewise; a status past it is not. */
    e.n = 0;
    e.status = WIRE_COOP_REFUSED;
    len = wire_coop_tokens_encode(buf, sizeof buf, &e);
    CHECK(wire_coop_tokens_decode(&d, buf, len, dt, 2, err) == 0);
    CHECK(d.status == WIRE_COOP_REFUSED && d.n == 0 &&
          !strcmp(d.error, "helper: out of KV blocks"));
    e.status = WIRE_COOP_REFUSED + 1;
    len = wire_coop_tokens_encode(buf, sizeof buf, &e);
    CHECK(len > 0 && wire_coop_tokens_decode(&d, buf, len, dt, 2, err) == -1);
    CHECKF(strstr(err, "status 3 unknown"), "%s", err);

    struct wire_coop_open o = {.seq = 3,
                               .temperature = 0.8f,
                               .top_p = 0.9f,
                               .top_k = 40,
                               .min_p = 0.05f,
                               .rng = 0xdeadbeefcafef00dull},
                          od;
    len = wire_coop_open_encode(buf, sizeof buf, &o);
    CHECK(len == WIRE_COOP_OPEN_LEN);
    CHECK(wire_coop_open_decode(&od, buf, len, err) == 0);
    CHECK(od.seq == 3 && od.temperature == 0.8f && od.top_p == 0.9f && od.top_k == 40 &&
          od.min_p == 0.05f && od.rng == o.rng);
    CHECK_STRICT(wire_coop_open_decode(&od, buf, L, err));
    o.top_p = NAN;
    len = wire_coop_open_encode(buf, sizeof buf, &o);
    CHECK(wire_coop_open_decode(&od, buf, len, err) == -1);
    o.top_p = 1;
    o.temperature = -1;
    len = wire_coop_open_encode(buf, sizeof buf, &o);
    CHECK(wire_coop_open_decode(&od, buf, len, err) == -1);

    uint32_t seqs[3] = {4, 5, 6}, ds[3], n = 0;
    len = wire_coop_close_encode(buf, sizeof buf, seqs, 3);
    CHECK(len == 1 + 4 + 12 + 4);
    CHECK(wire_coop_close_decode(buf, len, ds, 3, &n, err) == 0 && n == 3 && ds[2] == 6);
    CHECK_STRICT(wire_coop_close_decode(buf, L, ds, 3, &n, err));
    CHECK(wire_coop_close_decode(buf, len, ds, 2, &n, err) == -1);
    CHECK(wire_coop_close_encode(buf, sizeof buf, seqs, 0) == 0);
}

/* Re-seal a coop message whose body was edited: the CRC of all bytes before it. */
static void reseal(uint8_t *buf, size_t len)
{
    uint32_t c = crc32c(0, buf, len - 4);
    for (int i = 0; i < 4; i++) buf[len - 4 + i] = (uint8_t)(c >> (8 * i));
}

TEST(coop_kv_request_and_chunks)
{
    static uint8_t buf[WIRE_MAX_MSG + 8];
    uint32_t seqs[3] = {7, 12, 0x01020304}, ns[3] = {483, 1, 60}, dseq[4], dn[4];
    struct wire_coop_kv_req q = {.req = 0x0102030405060708ull,
                                 .layer0 = 2,
                                 .layer1 = 5,
                                 .dtype = WIRE_F16,
                                 .count = 3,
                                 .seq = seqs,
                                 .n = ns},
                            qd;
    size_t len = wire_coop_kv_req_encode(buf, sizeof buf, &q);
    CHECK(len == wire_coop_kv_req_size(3) && len == WIRE_COOP_KV_REQ_HDR_LEN + 3 * 8 + 4);
    /* type, req (LE), layer0, layer1, dtype, count, then (seq, n) pairs */
    CHECK(buf[0] == MSG_COOP_KV_REQ && buf[1] == 0x08 && buf[8] == 0x01 && buf[9] == 2 &&
          buf[13] == 5 && buf[17] == WIRE_F16 && buf[18] == 3 && buf[22] == 7 && buf[26] == 0xe3 &&
          buf[27] == 0x01 && buf[30] == 12 && buf[34] == 1 && buf[38] == 0x04 && buf[41] == 0x01 &&
          buf[42] == 60);
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == 0);
    CHECK(qd.req == q.req && qd.layer0 == 2 && qd.layer1 == 5 && qd.dtype == WIRE_F16 &&
          qd.count == 3 && qd.seq == dseq && qd.n == dn);
    for (int i = 0; i < 3; i++) CHECK(dseq[i] == seqs[i] && dn[i] == ns[i]);
    CHECK_STRICT(wire_coop_kv_req_decode(&qd, buf, L, dseq, dn, 4, err));
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x04;
        CHECKF(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == -1,
               "byte %zu flipped was accepted", i);
        buf[i] ^= 0x04;
    }
    /* more sequences than the receiver has room for: refused before any is written */
    dseq[0] = 99;
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 2, err) == -1 &&
          strstr(err, "3 sequences, room for 2") && dseq[0] == 99);
    /* a count that does not match the length (sealed again): refused */
    buf[18] = 2;
    reseal(buf, len);
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == -1 && strstr(err, "bytes"));
    /* empty layer range, a sequence without positions, a type the KV cache never has, no
     * sequences, too many: refused even when sealed (or not encoded at all) */
    struct wire_coop_kv_req bad = q;
    bad.layer1 = 2;
    len = wire_coop_kv_req_encode(buf, sizeof buf, &bad);
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == -1 && strstr(err, "empty"));
    uint32_t ns0[3] = {5, 0, 5};
    bad = q, bad.n = ns0;
    len = wire_coop_kv_req_encode(buf, sizeof buf, &bad);
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == -1 &&
          strstr(err, "sequence 12: no positions"));
    bad = q, bad.dtype = WIRE_BF16;
    len = wire_coop_kv_req_encode(buf, sizeof buf, &bad);
    CHECK(wire_coop_kv_req_decode(&qd, buf, len, dseq, dn, 4, err) == -1);
    bad = q, bad.count = 0;
    CHECK(wire_coop_kv_req_encode(buf, sizeof buf, &bad) == 0);
    bad = q, bad.count = WIRE_COOP_KV_MAX_SEQS + 1;
    CHECK(wire_coop_kv_req_encode(buf, sizeof buf, &bad) == 0);
    CHECK(wire_coop_kv_req_encode(buf, 20, &q) == 0); /* no room */

    /* A chunk: 2 rows of kv_dim 3, f16 (bits as stored) then f32. */
    const uint16_t kh[6] = {0x3C00, 0xC000, 0x7BFF, 1, 2, 3}, vh[6] = {9, 8, 7, 6, 5, 0x8001};
    struct wire_coop_kv m = {.req = 11,
                             .seq = 7,
                             .layer = 3,
                             .pos0 = 16,
                             .n = 2,
                             .kv_dim = 3,
                             .dtype = WIRE_F16,
                             .k_src = kh,
                             .v_src = vh},
                        d;
    len = wire_coop_kv_encode(buf, sizeof buf, &m);
    CHECK(len == WIRE_COOP_KV_HDR_LEN + 2 * 12 + 2 + 4 && len == wire_coop_kv_size(2, 3, 1, 0));
    CHECK(buf[0] == MSG_COOP_KV && buf[1] == 11 && buf[9] == 7 && buf[13] == 0 && buf[14] == 3 &&
          buf[18] == 16 && buf[22] == 2 && buf[26] == 3 && buf[30] == WIRE_F16);
    const uint8_t *p = buf + WIRE_COOP_KV_HDR_LEN;
    CHECK(p[0] == 0x00 && p[1] == 0x3C && p[2] == 0x00 && p[3] == 0xC0 && p[12] == 9 &&
          p[22] == 0x01 && p[23] == 0x80);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == 0);
    CHECK(d.req == 11 && d.seq == 7 && d.status == 0 && d.layer == 3 && d.pos0 == 16 && d.n == 2 &&
          d.kv_dim == 3 && d.dtype == WIRE_F16 && d.error[0] == 0);
    uint16_t kd[6], vd[6];
    wire_coop_kv_elems(kd, d.k, 6, d.dtype);
    wire_coop_kv_elems(vd, d.v, 6, d.dtype);
    CHECK(!memcmp(kd, kh, sizeof kh) && !memcmp(vd, vh, sizeof vh));
    CHECK_STRICT(wire_coop_kv_decode(&d, buf, L, err));
    for (size_t i = 0; i < len; i++) {
        buf[i] ^= 0x20;
        CHECKF(wire_coop_kv_decode(&d, buf, len, err) == -1, "byte %zu flipped was accepted", i);
        buf[i] ^= 0x20;
    }
    /* n claims a row more than the bytes hold (sealed): a length error, not a read past the end */
    len = wire_coop_kv_encode(buf, sizeof buf, &m);
    buf[22] = 3;
    reseal(buf, len);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == -1 && strstr(err, "need more"));
    buf[22] = 0xff, buf[25] = 0xff; /* a huge n */
    reseal(buf, len);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == -1);
    const float kf[3] = {1.5f, -0.0f, 3e-39f}, vf[3] = {2, 4, 8};
    struct wire_coop_kv mf = {
        .req = 12, .seq = 1, .n = 1, .kv_dim = 3, .dtype = WIRE_F32, .k_src = kf, .v_src = vf};
    len = wire_coop_kv_encode(buf, sizeof buf, &mf);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == 0 && d.dtype == WIRE_F32);
    float kfd[3], vfd[3];
    wire_coop_kv_elems(kfd, d.k, 3, d.dtype);
    wire_coop_kv_elems(vfd, d.v, 3, d.dtype);
    CHECK(!memcmp(kfd, kf, sizeof kf) && !memcmp(vfd, vf, sizeof vf));
    /* An error answer: no rows, a message; rows with status 1 or none with status 0 never encode
     * and are refused when forged and sealed. */
    struct wire_coop_kv e = {.req = 13, .seq = 4, .status = 1, .kv_dim = 3, .dtype = WIRE_F16};
    snprintf(e.error, sizeof e.error, "the sequence is not open here");
    len = wire_coop_kv_encode(buf, sizeof buf, &e);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == 0);
    CHECK(d.status == 1 && d.n == 0 && !strcmp(d.error, "the sequence is not open here"));
    CHECK_STRICT(wire_coop_kv_decode(&d, buf, L, err));
    buf[13] = 0; /* status 0 with no rows and an error text */
    reseal(buf, len);
    CHECK(wire_coop_kv_decode(&d, buf, len, err) == -1);
    e.n = 1;
    CHECK(wire_coop_kv_encode(buf, sizeof buf, &e) == 0);
    m.n = 0;
    CHECK(wire_coop_kv_encode(buf, sizeof buf, &m) == 0);
    m.n = 2, m.dtype = WIRE_BF16;
    CHECK(wire_coop_kv_encode(buf, sizeof buf, &m) == 0);
    m.dtype = WIRE_F16, m.kv_dim = 0;
    CHECK(wire_coop_kv_encode(buf, sizeof buf, &m) == 0);
    /* Chunks sized by max_rows fit one message; one row more does not. */
    for (uint32_t kvd = 64; kvd <= 8192; kvd *= 4) {
        uint32_t r = wire_coop_kv_max_rows(kvd, WIRE_F16);
        CHECK(r > 0 && wire_coop_kv_size(r, kvd, WIRE_F16, 0) <= WIRE_MAX_MSG &&
              wire_coop_kv_size(r + 1, kvd, WIRE_F16, 0) > WIRE_MAX_MSG);
    }
    CHECK(wire_coop_kv_max_rows(768, WIRE_F16) == 341);
}

int main(void)
{
    RUN(crc32c_vectors);
    RUN(crc32c_hw_matches_table_and_chains);
    RUN(ieee754_f32_bits);
    RUN(fp16_bf16_patterns);
    RUN(header_roundtrip_and_bytes);
    RUN(manifest_roundtrip_and_rejects);
    RUN(join_roundtrip_and_rejects);
    RUN(chunk_roundtrip_and_rejects);
    RUN(small_messages);
    RUN(activations_f32_f16_bf16);
    RUN(activations_token_rows);
    RUN(coop_tokens_open_close);
    RUN(coop_kv_request_and_chunks);
    CHECK_DONE();
}
