/* repack: ggml rows -> 16-row groups (see repack.h for the layouts and why). Each layout is a
 * pair of functions between the 16 rows' ggml blocks at one block index and the record that
 * replaces them; the super-block ones are in repack_kquants.c. */
#include "serving/engine/repack.h"

#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"
#include "serving/engine/quant.h"
#include "serving/engine/repack_formats.h"
#include "serving/engine/threadpool.h"

#include <stdlib.h>
#include <string.h>

/* ---- Q4_0 and Q8_0 ---------------------------------------------------------------------- */

/* 4 quant bytes at a time: byte group k of row r goes to repack_quant_at(r, 4k). */
static void pack_q4_0(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q4_0x16 *d = (struct block_q4_0x16 *)dst;
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q4_0 *in = (const struct block_q4_0 *)src[r];
        d->d[r] = in->d;
        for (int k = 0; k < 4; k++) memcpy(d->qs + repack_quant_at(r, 4 * k), in->qs + 4 * k, 4);
    }
}

static void unpack_q4_0(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q4_0x16 *s = (const struct block_q4_0x16 *)src;
    struct block_q4_0 *out = (struct block_q4_0 *)dst;
    out->d = s->d[r];
    for (int k = 0; k < 4; k++) memcpy(out->qs + 4 * k, s->qs + repack_quant_at(r, 4 * k), 4);
}

static void pack_q8_0(const uint8_t *const *src, uint8_t *dst)
{
    struct block_q8_0x16 *d = (struct block_q8_0x16 *)dst;
    for (int r = 0; r < REPACK_ROWS; r++) {
        const struct block_q8_0 *in = (const struct block_q8_0 *)src[r];
        d->d[r] = in->d;
        for (int k = 0; k < 8; k++) {
            uint32_t v;
            memcpy(&v, in->qs + 4 * k, 4);
            v ^= 0x80808080u; /* +128 on each byte */
            memcpy(d->qs + repack_quant_at(r, 4 * k), &v, 4);
        }
    }
}

static void unpack_q8_0(const uint8_t *src, int r, uint8_t *dst)
{
    const struct block_q8_0x16 *s = (const struct block_q8_0x16 *)src;
    struct block_q8_0 *out = (struct block_q8_0 *)dst;
    out->d = s->d[r];
    for (int k = 0; k < 8; k++) {
        uint32_t v;
        memcpy(&v, s->qs + repack_quant_at(r, 4 * k), 4);
        v ^= 0x80808080u;
        memcpy(out->qs + 4 * k, &v, 4);
    }
}

/* ---- Q4_1, Q5_0, Q5_1, IQ4_NL ----------------------------------------------------------------
 * One function per direction for the four: where d, the min and the 5th bits sit in the ggml
 * block (offsets; -1 if absent) and in the record. */
struct small_layout {
    int m, qh, qs;    /* offsets in the ggml block; -1: none */
    int rm, rqh, rqs; /* offsets in the record */
};

static const struct small_layout small_q4_1 = {2, -1, 4, 32, -1, 64};
static const struct small_layout small_q5_0 = {-1, 2, 6, -1, 32, 96};
static const struct small_layout small_q5_1 = {2, 4, 8, 32, 64, 128};
static const struct small_layout small_iq4_nl = {-1, -1, 2, -1, -1, 32};

/* ggml's qh (bit e: the 5th bit of element e) <-> the record's byte p, bits 2k / 2k + 1. */
static uint32_t qh_to_planes(uint32_t qh)
{
    uint32_t out = 0;
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 4; p++) {
            out |= (qh >> (4 * k + p) & 1) << (8 * p + 2 * k);
            out |= (qh >> (16 + 4 * k + p) & 1) << (8 * p + 2 * k + 1);
        }
    return out;
}

static uint32_t planes_to_qh(uint32_t v)
{
    uint32_t qh = 0;
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 4; p++) {
            qh |= (v >> (8 * p + 2 * k) & 1) << (4 * k + p);
            qh |= (v >> (8 * p + 2 * k + 1) & 1) << (16 + 4 * k + p);
        }
    return qh;
}

static void pack_small(const struct small_layout *l, const uint8_t *const *src, uint8_t *dst)
{
    for (int r = 0; r < REPACK_ROWS; r++) {
        memcpy(dst + 2 * r, src[r], 2);
        if (l->m >= 0) memcpy(dst + l->rm + 2 * r, src[r] + l->m, 2);
        if (l->qh >= 0) {
            uint32_t qh;
            memcpy(&qh, src[r] + l->qh, 4);
            qh = qh_to_planes(qh);
            memcpy(dst + l->rqh + repack_quant_at(r, 0), &qh, 4);
        }
        for (int k = 0; k < 4; k++)
            memcpy(dst + l->rqs + repack_quant_at(r, 4 * k), src[r] + l->qs + 4 * k, 4);
    }
}

static void unpack_small(const struct small_layout *l, const uint8_t *src, int r, uint8_t *dst)
{
    memcpy(dst, src + 2 * r, 2);
    if (l->m >= 0) memcpy(dst + l->m, src + l->rm + 2 * r, 2);
    if (l->qh >= 0) {
        uint32_t v;
        memcpy(&v, src + l->rqh + repack_quant_at(r, 0), 4);
        v = planes_to_qh(v);
        memcpy(dst + l->qh, &v, 4);
    }
    for (int k = 0; k < 4; k++)
        memcpy(dst + l->qs + 4 * k, src + l->rqs + repack_quant_at(r, 4 * k), 4);
}

#define SMALL(name)                                                                                \
    static void pack_##name(const uint8_t *const *src, uint8_t *dst)                               \
    {                                                                                              \
        pack_small(&small_##name, src, dst);                                                       \
    }                                                                                              \
    static void unpack_##name(const uint8_t *src, int r, uint8_t *dst)                             \
    {                                                                                              \
        unpack_small(&small_##name, src, r, dst);                                                  \
    }
SMALL(q4_1)
SMALL(q5_0)
SMALL(q5_1)
SMALL(iq4_nl)
#undef SMALL

/* ---- the table ------------------------------------------------------------------------------ */

static const struct repack_format formats[] = {
    {GGML_Q4_0, TENSOR_Q4_0_X16, "q4_0x16", pack_q4_0, unpack_q4_0},
    {GGML_Q8_0, TENSOR_Q8_0_X16, "q8_0x16", pack_q8_0, unpack_q8_0},
    {GGML_Q4_1, TENSOR_Q4_1_X16, "q4_1x16", pack_q4_1, unpack_q4_1},
    {GGML_Q5_0, TENSOR_Q5_0_X16, "q5_0x16", pack_q5_0, unpack_q5_0},
    {GGML_Q5_1, TENSOR_Q5_1_X16, "q5_1x16", pack_q5_1, unpack_q5_1},
    {GGML_IQ4_NL, TENSOR_IQ4_NL_X16, "iq4_nlx16", pack_iq4_nl, unpack_iq4_nl},
    {GGML_Q2_K, TENSOR_Q2_K_X16, "q2_kx16", repack_pack_q2_K, repack_unpack_q2_K},
    {GGML_Q3_K, TENSOR_Q3_K_X16, "q3_kx16", repack_pack_q3_K, repack_unpack_q3_K},
    {GGML_Q4_K, TENSOR_Q4_K_X16, "q4_kx16", repack_pack_q4_K, repack_unpack_q4_K},
    {GGML_Q5_K, TENSOR_Q5_K_X16, "q5_kx16", repack_pack_q5_K, repack_unpack_q5_K},
    {GGML_Q6_K, TENSOR_Q6_K_X16, "q6_kx16", repack_pack_q6_K, repack_unpack_q6_K},
    {GGML_IQ4_XS, TENSOR_IQ4_XS_X16, "iq4_xsx16", repack_pack_iq4_xs, repack_unpack_iq4_xs},
};

static const struct repack_format *format_of(uint32_t type)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].ggml_type == type || formats[i].type == type) return &formats[i];
    return NULL;
}

uint32_t repack_type_of(uint32_t ggml_type)
{
    const struct repack_format *f = format_of(ggml_type);
    return f && f->ggml_type == ggml_type ? f->type : 0;
}

uint32_t repack_base_type(uint32_t type)
{
    const struct repack_format *f = format_of(type);
    return f && f->type == type ? f->ggml_type : type;
}

const char *tensor_type_name(uint32_t type)
{
    const struct repack_format *f = format_of(type);
    return f && f->type == type ? f->name : ggml_type_name(type);
}

int repack_eligible(const struct tensor *t)
{
    int blk = ggml_block_elems(t->type);
    return repack_type_of(t->type) && t->rows > 0 && t->rows % REPACK_ROWS == 0 && blk > 1 &&
           t->cols % blk == 0;
}

/* The groups of 16 rows of one tensor, split over the pool's threads; each has its own staging
 * copy of the group it rewrites. */
struct repack_job {
    const struct repack_format *f;
    uint8_t *w;
    int nb, groups;
    size_t rb, bb, group;
    uint8_t *tmp; /* [threads][group] */
};

static void repack_worker(void *arg, int ith, int nth)
{
    const struct repack_job *j = arg;
    uint8_t *tmp = j->tmp + (size_t)ith * j->group;
    for (int g = ith; g < j->groups; g += nth) {
        uint8_t *p = j->w + (size_t)g * j->group;
        memcpy(tmp, p, j->group);
        for (int b = 0; b < j->nb; b++) {
            const uint8_t *src[REPACK_ROWS];
            for (int r = 0; r < REPACK_ROWS; r++)
                src[r] = tmp + (size_t)r * j->rb + (size_t)b * j->bb;
            j->f->pack(src, p + (size_t)b * j->bb * REPACK_ROWS);
        }
    }
}

int repack_tensor_tp(struct tensor *t, struct threadpool *tp, char *err)
{
    if (!repack_eligible(t)) return 0;
    const struct repack_format *f = format_of(t->type);
    const int nb = t->cols / ggml_block_elems(t->type);
    const size_t rb = ggml_row_bytes(t->type, (uint64_t)t->cols);
    const int threads = tp ? threadpool_size(tp) : 1;
    /* The engine owns the weight image: this is the one place that writes to it. */
    struct repack_job j = {f,
                           (uint8_t *)(uintptr_t)t->data,
                           nb,
                           t->rows / REPACK_ROWS,
                           rb,
                           rb / (size_t)nb,
                           rb * REPACK_ROWS,
                           NULL};
    if (!(j.tmp = malloc(j.group * (size_t)threads)))
        return errmsg_set(err, "repack: no memory for %d %zu-byte groups of %d x %d %s", threads,
                          j.group, t->rows, t->cols, ggml_type_name(t->type));
    if (tp && threads > 1)
        threadpool_run(tp, repack_worker, &j);
    else
        repack_worker(&j, 0, 1);
    free(j.tmp);
    t->type = f->type;
    return 0;
}

int repack_tensor(struct tensor *t, char *err)
{
    return repack_tensor_tp(t, NULL, err);
}

void repack_unpack(uint32_t type, const void *record, int r, void *block)
{
    format_of(type)->unpack(record, r, block);
}

void repack_block(const struct tensor *t, int row, int b, void *block)
{
    const struct repack_format *f = format_of(t->type);
    const int nb = t->cols / ggml_block_elems(f->ggml_type);
    const size_t rb = ggml_row_bytes(f->ggml_type, (uint64_t)t->cols), bb = rb / (size_t)nb;
    const uint8_t *g = (const uint8_t *)t->data + (size_t)(row / REPACK_ROWS) * rb * REPACK_ROWS;
    f->unpack(g + (size_t)b * bb * REPACK_ROWS, row % REPACK_ROWS, block);
}

void repack_dequantize_row(const struct tensor *t, int row, float *out)
{
    const uint32_t base = repack_base_type(t->type);
    const int blk = ggml_block_elems(base), nb = t->cols / blk;
    uint8_t block[512];
    for (int b = 0; b < nb; b++) {
        repack_block(t, row, b, block);
        dequantize_row(base, block, out + (size_t)b * blk, blk);
    }
}
