/* repack_kquants: the 16-row records of the super-block formats (layouts in repack.h). */
#include "serving/engine/quant.h"
#include "serving/engine/repack.h"
#include "serving/engine/repack_formats.h"

#include <stddef.h>
#include <string.h>

void six_bits_put(struct six_bits_x16 *f, int r, int v)
{
    const int k = r % 8, sh = 4 * (r / 8);
    f->lo[k] = (uint8_t)((f->lo[k] & ~(0xf << sh)) | (v & 0xf) << sh);
    const int hk = r % 4, hsh = 2 * (r / 4);
    f->hi[hk] = (uint8_t)((f->hi[hk] & ~(3 << hsh)) | ((v >> 4) & 3) << hsh);
}

int six_bits_get(const struct six_bits_x16 *f, int r)
{
    return (f->lo[r % 8] >> (4 * (r / 8)) & 0xf) | (f->hi[r % 4] >> (2 * (r / 4)) & 3) << 4;
}

/* A quant plane of n bytes per row, 4 bytes per row at a time (repack_quant_at). */
static void plane_pack(const uint8_t *const *rows, size_t off, int n, uint8_t *dst)
{
    for (int r = 0; r < REPACK_ROWS; r++)
        for (int i = 0; i < n; i += 4) memcpy(dst + repack_quant_at(r, i), rows[r] + off + i, 4);
}

static void plane_unpack(const uint8_t *src, int r, int n, uint8_t *dst)
{
    for (int i = 0; i < n; i += 4) memcpy(dst + i, src + repack_quant_at(r, i), 4);
}

/* 4-bit quants of 256 elements between ggml's K layout (byte l of group g: elements 64g + l and
 * 64g + 32 + l) and the per-sub-block layout (byte 16j + i: elements 32j + i and 32j + 16 + i). */
static void nibbles_k_to_sub(const uint8_t *k, uint8_t *sub)
{
    uint8_t e[256];
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            e[64 * g + l] = k[32 * g + l] & 0xf, e[64 * g + 32 + l] = k[32 * g + l] >> 4;
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 16; i++)
            sub[16 * j + i] = (uint8_t)(e[32 * j + i] | e[32 * j + 16 + i] << 4);
}

static void nibbles_sub_to_k(const uint8_t *sub, uint8_t *k)
{
    uint8_t e[256];
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 16; i++)
            e[32 * j + i] = sub[16 * j + i] & 0xf, e[32 * j + 16 + i] = sub[16 * j + i] >> 4;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            k[32 * g + l] = (uint8_t)(e[64 * g + l] | e[64 * g + 32 + l] << 4);
}

/* ---- Q2_K and Q3_K ---------------------------------------------------------------------------
 * Their ggml blocks hold 2 bits of element 128h + 32s + l in bits 2s of qs[32h + l]; Q3_K adds
 * bit (e / 32) of hmask[e % 32] as the third. */

/* All 256 2-bit values of a block, in element order. */
static void q2_all(const uint8_t *qs, uint8_t *v)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int b = qs[32 * h + l];
            uint8_t *e = v + 128 * h + l;
            e[0] = (uint8_t)(b & 3), e[32] = (uint8_t)(b >> 2 & 3);
            e[64] = (uint8_t)(b >> 4 & 3), e[96] = (uint8_t)(b >> 6);
        }
}

static void q2_bits_put(uint8_t *qs, int e, int v)
{
    qs[32 * (e / 128) + e % 32] |= (uint8_t)(v << (2 * (e % 128 / 32)));
}

void repack_pack_q2_K(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q2_Kx16 *d = (struct block_q2_Kx16 *)dst;
    uint8_t q[REPACK_ROWS][64];
    const uint8_t *rows[REPACK_ROWS];
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q2_K *in = (const struct block_q2_K *)src[r];
        d->d[r] = in->d;
        d->dmin[r] = in->dmin;
        uint8_t v[QK_K];
        q2_all(in->qs, v);
        for (int j = 0; j < 16; j++) {
            d->scales[j][r] = in->scales[j];
            for (int p = 0; p < 4; p++)
                q[r][4 * j + p] = (uint8_t)(v[16 * j + p] | v[16 * j + 4 + p] << 2 |
                                            v[16 * j + 8 + p] << 4 | v[16 * j + 12 + p] << 6);
        }
        rows[r] = q[r];
    }
    plane_pack(rows, 0, 64, d->qs);
}

void repack_unpack_q2_K(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q2_Kx16 *s = (const struct block_q2_Kx16 *)src;
    struct block_q2_K *out = (struct block_q2_K *)dst;
    uint8_t q[64];
    plane_unpack(s->qs, r, 64, q);
    memset(out->qs, 0, sizeof out->qs);
    for (int j = 0; j < 16; j++) {
        out->scales[j] = s->scales[j][r];
        for (int sh = 0; sh < 4; sh++)
            for (int p = 0; p < 4; p++)
                q2_bits_put(out->qs, 16 * j + 4 * sh + p, q[4 * j + p] >> (2 * sh) & 3);
    }
    out->d = s->d[r];
    out->dmin = s->dmin[r];
}

/* Q3_K's 3-bit values of a 32-element pair k: 8 groups of 4 -> 12 bytes (repack.h). */
static void q3_pack32(const uint8_t *v, uint8_t *c)
{
    for (int p = 0; p < 4; p++) {
        const int g6 = v[24 + p], g7 = v[28 + p];
        c[p] = (uint8_t)(v[p] | v[12 + p] << 3 | (g6 & 3) << 6);
        c[4 + p] = (uint8_t)(v[4 + p] | v[16 + p] << 3 | (g6 >> 2) << 6 | (g7 & 1) << 7);
        c[8 + p] = (uint8_t)(v[8 + p] | v[20 + p] << 3 | (g7 >> 1) << 6);
    }
}

static void q3_unpack32(const uint8_t *c, uint8_t *v)
{
    for (int p = 0; p < 4; p++) {
        for (int i = 0; i < 3; i++) {
            v[4 * i + p] = c[4 * i + p] & 7;
            v[12 + 4 * i + p] = c[4 * i + p] >> 3 & 7;
        }
        v[24 + p] = (uint8_t)((c[p] >> 6) | (c[4 + p] >> 6 & 1) << 2);
        v[28 + p] = (uint8_t)((c[4 + p] >> 7) | (c[8 + p] >> 6) << 1);
    }
}

void repack_pack_q3_K(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q3_Kx16 *d = (struct block_q3_Kx16 *)dst;
    uint8_t q[REPACK_ROWS][96];
    const uint8_t *rows[REPACK_ROWS];
    memset(d->sc, 0, sizeof d->sc);
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q3_K *in = (const struct block_q3_K *)src[r];
        d->d[r] = in->d;
        uint8_t v[QK_K];
        q2_all(in->qs, v);
        for (int e = 0; e < QK_K; e++) v[e] |= (uint8_t)((in->hmask[e & 31] >> (e >> 5) & 1) << 2);
        for (int j = 0; j < 16; j++) six_bits_put(&d->sc[j], r, q3_K_scale(j, in->scales));
        for (int k = 0; k < 8; k++) q3_pack32(v + 32 * k, q[r] + 12 * k);
        rows[r] = q[r];
    }
    plane_pack(rows, 0, 96, d->q);
}

void repack_unpack_q3_K(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q3_Kx16 *s = (const struct block_q3_Kx16 *)src;
    struct block_q3_K *out = (struct block_q3_K *)dst;
    uint8_t q[96], v[QK_K];
    plane_unpack(s->q, r, 96, q);
    for (int k = 0; k < 8; k++) q3_unpack32(q + 12 * k, v + 32 * k);
    memset(out->qs, 0, sizeof out->qs);
    memset(out->hmask, 0, sizeof out->hmask);
    for (int e = 0; e < QK_K; e++) {
        q2_bits_put(out->qs, e, v[e] & 3);
        out->hmask[e % 32] |= (uint8_t)((v[e] >> 2) << (e / 32));
    }
    /* the 12 scale bytes (quant.h's layout) */
    memset(out->scales, 0, 12);
    for (int j = 0; j < 16; j++) {
        const int l = six_bits_get(&s->sc[j], r);
        if (j < 8)
            out->scales[j] |= (uint8_t)(l & 0xf);
        else
            out->scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
        out->scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
    }
    out->d = s->d[r];
}

/* ---- IQ4_XS --------------------------------------------------------------------------------- */

void repack_pack_iq4_xs(const uint8_t *const *src, uint8_t *dst)
{
    struct block_iq4_xsx16 *d = (struct block_iq4_xsx16 *)dst;
    memset(d->sc, 0, sizeof d->sc);
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_iq4_xs *in = (const struct block_iq4_xs *)src[r];
        d->d[r] = in->d;
        for (int j = 0; j < 8; j++) six_bits_put(&d->sc[j], r, iq4_xs_scale(j, in));
    }
    plane_pack(src, offsetof(struct block_iq4_xs, qs), 128, d->qs);
}

void repack_unpack_iq4_xs(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_iq4_xsx16 *s = (const struct block_iq4_xsx16 *)src;
    struct block_iq4_xs *out = (struct block_iq4_xs *)dst;
    out->d = s->d[r];
    out->scales_h = 0;
    memset(out->scales_l, 0, sizeof out->scales_l);
    for (int j = 0; j < 8; j++) {
        const int l = six_bits_get(&s->sc[j], r);
        out->scales_l[j / 2] |= (uint8_t)((l & 0xf) << (4 * (j % 2)));
        out->scales_h |= (uint16_t)((l >> 4) << (2 * j));
    }
    plane_unpack(s->qs, r, 128, out->qs);
}

/* ---- Q4_K ----------------------------------------------------------------------------------- */

void repack_pack_q4_K(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q4_Kx16 *d = (struct block_q4_Kx16 *)dst;
    uint8_t sub[REPACK_ROWS][128];
    const uint8_t *rows[REPACK_ROWS];
    memset(d->sm, 0, sizeof d->sm);
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q4_K *in = (const struct block_q4_K *)src[r];
        d->d[r] = in->d;
        d->dmin[r] = in->dmin;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4_K_scale_min(j, in->scales, &sc, &m);
            six_bits_put(&d->sm[j], r, sc);
            six_bits_put(&d->sm[8 + j], r, m);
        }
        nibbles_k_to_sub(in->qs, sub[r]);
        rows[r] = sub[r];
    }
    plane_pack(rows, 0, 128, d->qs);
}

/* The 12 scale bytes of Q4_K/Q5_K from 8 scales and 8 mins (quant.h's layout). */
static void k_scales_put(uint8_t *s, const int *sc, const int *m)
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = (uint8_t)sc[j];
            s[j + 4] = (uint8_t)m[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 0xf) | (m[j] & 0xf) << 4);
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

void repack_unpack_q4_K(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q4_Kx16 *s = (const struct block_q4_Kx16 *)src;
    struct block_q4_K *out = (struct block_q4_K *)dst;
    int sc[8], m[8];
    for (int j = 0; j < 8; j++)
        sc[j] = six_bits_get(&s->sm[j], r), m[j] = six_bits_get(&s->sm[8 + j], r);
    out->d = s->d[r];
    out->dmin = s->dmin[r];
    k_scales_put(out->scales, sc, m);
    uint8_t sub[128];
    plane_unpack(s->qs, r, 128, sub);
    nibbles_sub_to_k(sub, out->qs);
}

/* ---- Q5_K ----------------------------------------------------------------------------------- */

void repack_pack_q5_K(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q5_Kx16 *d = (struct block_q5_Kx16 *)dst;
    uint8_t sub[REPACK_ROWS][128], hb[REPACK_ROWS][32];
    const uint8_t *rows[REPACK_ROWS], *hrows[REPACK_ROWS];
    memset(d->sm, 0, sizeof d->sm);
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q5_K *in = (const struct block_q5_K *)src[r];
        d->d[r] = in->d;
        d->dmin[r] = in->dmin;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4_K_scale_min(j, in->scales, &sc, &m);
            six_bits_put(&d->sm[j], r, sc);
            six_bits_put(&d->sm[8 + j], r, m);
        }
        nibbles_k_to_sub(in->qs, sub[r]);
        /* 5th bit of element e: bit 2g (low half of group g) or 2g+1 of qh[e % 32] */
        memset(hb[r], 0, 32);
        for (int j = 0; j < 8; j++)
            for (int c = 0; c < 4; c++)
                for (int p = 0; p < 4; p++) {
                    const int e0 = 32 * j + 4 * c + p, e1 = e0 + 16;
                    const int b0 = in->qh[e0 % 32] >> (e0 / 32) & 1,
                              b1 = in->qh[e1 % 32] >> (e1 / 32) & 1;
                    hb[r][4 * j + p] |= (uint8_t)(b0 << (2 * c) | b1 << (2 * c + 1));
                }
        rows[r] = sub[r];
        hrows[r] = hb[r];
    }
    plane_pack(rows, 0, 128, d->qs);
    plane_pack(hrows, 0, 32, d->qh);
}

void repack_unpack_q5_K(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q5_Kx16 *s = (const struct block_q5_Kx16 *)src;
    struct block_q5_K *out = (struct block_q5_K *)dst;
    int sc[8], m[8];
    for (int j = 0; j < 8; j++)
        sc[j] = six_bits_get(&s->sm[j], r), m[j] = six_bits_get(&s->sm[8 + j], r);
    out->d = s->d[r];
    out->dmin = s->dmin[r];
    k_scales_put(out->scales, sc, m);
    uint8_t sub[128], hb[32];
    plane_unpack(s->qs, r, 128, sub);
    plane_unpack(s->qh, r, 32, hb);
    nibbles_sub_to_k(sub, out->qs);
    memset(out->qh, 0, sizeof out->qh);
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < 4; c++)
            for (int p = 0; p < 4; p++) {
                const int e0 = 32 * j + 4 * c + p, e1 = e0 + 16;
                out->qh[e0 % 32] |= (uint8_t)((hb[4 * j + p] >> (2 * c) & 1) << (e0 / 32));
                out->qh[e1 % 32] |= (uint8_t)((hb[4 * j + p] >> (2 * c + 1) & 1) << (e1 / 32));
            }
}

/* ---- Q6_K ----------------------------------------------------------------------------------- */

/* The 256 6-bit quants of a Q6_K block (0..63, the format subtracts 32), in element order:
 * element 128h + 32s + l from ql[64h + l + 32(s & 1)] (nibble s / 2) and qh[32h + l] (bits 2s). */
static void q6_K_quants(const struct block_q6_K *b, uint8_t *q)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int ql0 = b->ql[64 * h + l], ql1 = b->ql[64 * h + 32 + l], qh = b->qh[32 * h + l];
            uint8_t *e = q + 128 * h + l;
            e[0] = (uint8_t)((ql0 & 0xf) | (qh & 3) << 4);
            e[32] = (uint8_t)((ql1 & 0xf) | (qh >> 2 & 3) << 4);
            e[64] = (uint8_t)((ql0 >> 4) | (qh >> 4 & 3) << 4);
            e[96] = (uint8_t)((ql1 >> 4) | (qh >> 6 & 3) << 4);
        }
}

static void q6_K_from_quants(const uint8_t *q, struct block_q6_K *b)
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *e = q + 128 * h + l;
            b->ql[64 * h + l] = (uint8_t)((e[0] & 0xf) | (e[64] & 0xf) << 4);
            b->ql[64 * h + 32 + l] = (uint8_t)((e[32] & 0xf) | (e[96] & 0xf) << 4);
            b->qh[32 * h + l] =
                (uint8_t)((e[0] >> 4) | (e[32] >> 4) << 2 | (e[64] >> 4) << 4 | (e[96] >> 4) << 6);
        }
}

void repack_pack_q6_K(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q6_Kx16 *d = (struct block_q6_Kx16 *)dst;
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q6_K *in = (const struct block_q6_K *)src[r];
        uint8_t q[QK_K];
        q6_K_quants(in, q);
        d->d[r] = in->d;
        for (int j = 0; j < 16; j++) {
            d->scales[j][r] = in->scales[j];
            const uint8_t *e = q + 16 * j;
            for (int k = 0; k < 3; k++) {
                uint8_t c[4];
                for (int p = 0; p < 4; p++)
                    c[p] = (uint8_t)(e[4 * k + p] | ((e[12 + p] >> (2 * k)) & 3) << 6);
                memcpy(d->q + 64 * (3 * j + k) + 32 * (r / 8) + 4 * (r % 8), c, 4);
            }
        }
    }
}

void repack_unpack_q6_K(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q6_Kx16 *s = (const struct block_q6_Kx16 *)src;
    struct block_q6_K *out = (struct block_q6_K *)dst;
    uint8_t q[QK_K];
    for (int j = 0; j < 16; j++) {
        uint8_t *e = q + 16 * j;
        for (int p = 0; p < 4; p++) e[12 + p] = 0;
        for (int k = 0; k < 3; k++) {
            uint8_t c[4];
            memcpy(c, s->q + 64 * (3 * j + k) + 32 * (r / 8) + 4 * (r % 8), 4);
            for (int p = 0; p < 4; p++) {
                e[4 * k + p] = c[p] & 63;
                e[12 + p] |= (uint8_t)((c[p] >> 6) << (2 * k));
            }
        }
        out->scales[j] = s->scales[j][r];
    }
    out->d = s->d[r];
    q6_K_from_quants(q, out);
}
