/* cuda_plan: device layout and upload schedule of the weights (see cuda_plan.h). */
#include "serving/engine/cuda/cuda_plan.h"

#include "serving/engine/repack.h"

#include "os/common/errmsg.h"
#include "serving/engine/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Planes qs, e, s, d: {offset in the ggml block, bytes} (k_quant.cuh's table; quant.h's structs
 * give the offsets). */
static const struct cuda_block_format formats[] = {
    {GGML_Q8_0, 32, 34, {2, 0, 0, 0}, {32, 0, 0, 2}},
    {GGML_Q4_0, 32, 18, {2, 0, 0, 0}, {16, 0, 0, 2}},
    {GGML_Q4_1, 32, 20, {4, 0, 0, 0}, {16, 0, 0, 4}},
    {GGML_Q5_0, 32, 22, {6, 2, 0, 0}, {16, 4, 0, 2}},
    {GGML_Q5_1, 32, 24, {8, 4, 0, 0}, {16, 4, 0, 4}},
    {GGML_IQ4_NL, 32, 18, {2, 0, 0, 0}, {16, 0, 0, 2}},
    {GGML_Q2_K, 256, 84, {16, 0, 0, 80}, {64, 0, 16, 4}},
    {GGML_Q3_K, 256, 110, {32, 0, 96, 108}, {64, 32, 12, 2}},
    {GGML_Q4_K, 256, 144, {16, 0, 0, 0}, {128, 0, 0, 16}},
    {GGML_Q5_K, 256, 176, {48, 16, 0, 0}, {128, 32, 0, 16}},
    {GGML_Q6_K, 256, 210, {0, 128, 192, 208}, {128, 64, 16, 2}},
    {GGML_IQ4_XS, 256, 136, {8, 0, 0, 0}, {128, 0, 0, 8}},
};

const struct cuda_block_format *cuda_block_format(uint32_t type)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == type) return &formats[i];
    return NULL;
}

uint64_t cuda_ggml_row_bytes(uint32_t type, int cols)
{
    int device_type =
        type == GGML_F32 || type == GGML_F16 || type == GGML_BF16 || cuda_block_format(type);
    return device_type && cols > 0 ? ggml_row_bytes(type, (uint64_t)cols) : 0;
}

static const char *const layer_names[CUDA_LAYER_TENSORS] = {
    [CM_ATTN_NORM] = "attn_norm",
    [CM_Q] = "attn_q",
    [CM_K] = "attn_k",
    [CM_V] = "attn_v",
    [CM_O] = "attn_output",
    [CM_FFN_NORM] = "ffn_norm",
    [CM_GATE] = "ffn_gate",
    [CM_DOWN] = "ffn_down",
    [CM_UP] = "ffn_up",
    [CM_BQ] = "attn_q.bias",
    [CM_BK] = "attn_k.bias",
    [CM_BV] = "attn_v.bias",
    [CM_Q_NORM] = "attn_q_norm",
    [CM_K_NORM] = "attn_k_norm",
    [CM_ROPE_FREQS] = "rope_freqs",
};

/* What a vector must be: NULL for a matrix. */
static const char *vector_kind(int f)
{
    switch (f) {
    case CM_ATTN_NORM:
    case CM_FFN_NORM:
    case CM_Q_NORM:
    case CM_K_NORM:
        return "norm weights";
    case CM_BQ:
    case CM_BK:
    case CM_BV:
        return "biases";
    case CM_ROPE_FREQS:
        return "rope frequency factors";
    default:
        return NULL;
    }
}

/* 1 if a layer of config c has tensor f. */
static int layer_has(const struct model_config *c, int f)
{
    if (f >= CM_BQ && f <= CM_BV) return c->qkv_bias;
    if (f == CM_Q_NORM || f == CM_K_NORM) return c->qk_norm;
    if (f == CM_ROPE_FREQS) return c->rope_freqs;
    return 1;
}

/* Fill one mat's shape and device sizes; the offsets come later. f32_only: NULL for a matrix,
 * else what the vector is (read element-wise: no row padding). */
static int plan_mat(struct cuda_mat *c, const struct tensor *t, const char *name, int span,
                    const char *f32_only, char *err)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    c->name = name;
    c->span = span;
    c->type = t->type;
    c->rows = t->rows;
    c->cols = t->cols;
    if (!t->data || t->rows <= 0 || t->cols <= 0)
        return errmsg_set(err, "cuda: tensor %s: no data or empty shape %dx%d", name, t->cols,
                          t->rows);
    if (f32_only && t->type != GGML_F32)
        return errmsg_set(err, "cuda: tensor %s: %s must be f32, not %s", name, f32_only,
                          tensor_type_name(t->type));
    uint64_t rb = cuda_ggml_row_bytes(t->type, t->cols);
    const struct cuda_block_format *bf = cuda_block_format(t->type);
    if (!rb) {
        if (bf)
            return errmsg_set(err, "cuda: tensor %s: %d columns is not a multiple of %d", name,
                              t->cols, bf->elems);
        return errmsg_set(err, "cuda: tensor %s: type %s is not supported by the CUDA kernels",
                          name, tensor_type_name(t->type));
    }
    if (t->nbytes != rb * (uint64_t)t->rows)
        return errmsg_set(err, "cuda: tensor %s: %zu bytes, expected %llu for %dx%d %s", name,
                          t->nbytes, (unsigned long long)(rb * t->rows), t->cols, t->rows,
                          tensor_type_name(t->type));
    switch (t->type) {
    case GGML_F32:
    case GGML_F16:
    case GGML_BF16: {
        int esz = t->type == GGML_F32 ? 4 : 2;
        /* Vectors (norms, biases, rope factors) are read element-wise: no row padding. Matrices
         * get rows of a multiple of 8 elements, so every row starts 16-byte aligned for the
         * vector loads. */
        c->ld = f32_only ? t->cols : (int)align_up((uint64_t)t->cols, 8);
        c->qs_bytes = (uint64_t)c->rows * c->ld * esz;
        break;
    }
    default: { /* a block type: its planes one after another, each 256-byte aligned */
        uint64_t nb = (uint64_t)t->rows * (t->cols / bf->elems), off;
        c->ld = t->cols;
        c->qs_bytes = nb * bf->len[CUDA_PLANE_QS];
        off = align_up(c->qs_bytes, CUDA_DEV_ALIGN);
        if (bf->len[CUDA_PLANE_E]) {
            c->e_off = off;
            c->e_bytes = nb * bf->len[CUDA_PLANE_E];
            off = align_up(off + c->e_bytes, CUDA_DEV_ALIGN);
        }
        if (bf->len[CUDA_PLANE_S]) {
            c->s_off = off;
            c->s_bytes = nb * bf->len[CUDA_PLANE_S];
            off = align_up(off + c->s_bytes, CUDA_DEV_ALIGN);
        }
        c->d_off = off;
        c->d_bytes = nb * bf->len[CUDA_PLANE_D];
        break;
    }
    }
    return 0;
}

int cuda_plan_weights(struct cuda_plan *p, const struct model *m, char *err)
{
    memset(p, 0, sizeof *p);
    int L = m->cfg.n_layers;
    if (L < 1 || L > MODEL_MAX_LAYERS)
        return errmsg_set(err, "cuda: %d layers (1..%d supported)", L, MODEL_MAX_LAYERS);
    p->n_spans = L + 2;
    p->layer_stride = 0;
    for (int f = 0; f < CUDA_LAYER_TENSORS; f++)
        p->layer_slot[f] = layer_has(&m->cfg, f) ? p->layer_stride++ : -1;
    size_t max_mats = (size_t)p->layer_stride * L + 3;
    p->mats = calloc(max_mats, sizeof *p->mats);
    /* Names outlive the plan's users only as long as the plan: one buffer, freed with it. */
    char *names = calloc(max_mats, 32);
    if (!p->mats || !names) {
        free(p->mats);
        free(names);
        p->mats = NULL;
        return errmsg_set(err, "cuda: out of memory for the weight plan");
    }
    int n = 0;
    snprintf(names, 32, "token_embd");
    if (plan_mat(&p->mats[n++], &m->token_embd, names, 0, NULL, err)) goto fail;
    for (int l = 0; l < L; l++) {
        const struct layer_weights *lw = &m->layers[l];
        const struct tensor *ts[CUDA_LAYER_TENSORS] = {
            [CM_ATTN_NORM] = &lw->attn_norm,
            [CM_Q] = &lw->wq,
            [CM_K] = &lw->wk,
            [CM_V] = &lw->wv,
            [CM_O] = &lw->wo,
            [CM_FFN_NORM] = &lw->ffn_norm,
            [CM_GATE] = &lw->w_gate,
            [CM_DOWN] = &lw->w_down,
            [CM_UP] = &lw->w_up,
            [CM_BQ] = &lw->bq,
            [CM_BK] = &lw->bk,
            [CM_BV] = &lw->bv,
            [CM_Q_NORM] = &lw->q_norm,
            [CM_K_NORM] = &lw->k_norm,
            [CM_ROPE_FREQS] = &lw->rope_freqs,
        };
        for (int f = 0; f < CUDA_LAYER_TENSORS; f++) {
            if (p->layer_slot[f] < 0) continue;
            char *nm = names + (size_t)n * 32;
            snprintf(nm, 32, "blk.%d.%s", l, layer_names[f]);
            if (plan_mat(&p->mats[n++], ts[f], nm, 1 + l, vector_kind(f), err)) goto fail;
        }
    }
    p->embd = 0;
    snprintf(names + (size_t)n * 32, 32, "output_norm");
    p->out_norm = n;
    if (plan_mat(&p->mats[n], &m->output_norm, names + (size_t)n * 32, L + 1, "norm weights", err))
        goto fail;
    n++;
    if (m->tied_output) {
        p->out = p->embd;
    } else {
        snprintf(names + (size_t)n * 32, 32, "output");
        p->out = n;
        if (plan_mat(&p->mats[n], &m->output, names + (size_t)n * 32, L + 1, NULL, err)) goto fail;
        n++;
    }
    p->n_mats = n;

    /* Spans: host byte ranges and staging offsets; device offsets in execution order. */
    uint64_t dev = 0;
    for (int i = 0, s = 0; s < p->n_spans; s++) {
        struct cuda_span *sp = &p->spans[s];
        sp->first_mat = i;
        const uint8_t *lo = NULL, *hi = NULL;
        uint64_t sum = 0;
        for (; i < n && p->mats[i].span == s; i++) {
            const struct tensor *t = p->mats[i].t;
            const uint8_t *a = t->data, *b = a + t->nbytes;
            if (!lo || a < lo) lo = a;
            if (!hi || b > hi) hi = b;
            sum += t->nbytes;
        }
        sp->n_mats = i - sp->first_mat;
        sp->host = lo;
        sp->bytes = (uint64_t)(hi - lo);
        /* The image places a span's tensors back to back (alignment gaps only); anything else
         * would make the staging copy drag unrelated bytes across PCIe. */
        if (sp->bytes > sum + (uint64_t)sp->n_mats * 4096) {
            errmsg_set(err, "cuda: span %d: tensors spread over %llu bytes for %llu of data", s,
                       (unsigned long long)sp->bytes, (unsigned long long)sum);
            cuda_plan_free(p);
            return -1;
        }
        if (sp->bytes > p->staging_bytes) p->staging_bytes = sp->bytes;
        for (int j = sp->first_mat; j < i; j++) {
            struct cuda_mat *c = &p->mats[j];
            c->src_off = (uint64_t)((const uint8_t *)c->t->data - lo);
            c->dst_off = dev;
            dev =
                align_up(dev + (c->d_bytes ? c->d_off + c->d_bytes : c->qs_bytes), CUDA_DEV_ALIGN);
        }
    }
    p->device_bytes = dev;
    return 0;
fail:
    free(names);
    free(p->mats);
    p->mats = NULL;
    return -1;
}

void cuda_plan_free(struct cuda_plan *p)
{
    if (p->mats) free((void *)p->mats[0].name); /* the names buffer starts with mats[0].name */
    free(p->mats);
    memset(p, 0, sizeof *p);
}
